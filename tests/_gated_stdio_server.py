"""A stdio perfgate server with the test-only command tool registered: ``python THIS WORKSPACE``."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import perfgate.tools
from _gated_tool import SPEC
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from perfgate.transports.stdio import run_stdio

perfgate.tools.REGISTRY = (*perfgate.tools.REGISTRY, SPEC)
run_stdio(build_server(ServerConfig.create(Path(sys.argv[1]))))  # as `perfgate serve` serves it
