"""Test helpers for the trust root: the operator's policy file lives there, never in the workspace."""

from __future__ import annotations

import json
from pathlib import Path

from perfgate.security.trustroot import TrustRoot


def operator_policy(text: str) -> Path:
    """Write the operator's policy (the test's own trust root, see conftest) and return its path."""
    path = TrustRoot.locate().policy_file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def any_code_rules(*prefixes: list[str]) -> str:
    """``[[execution.allow]]`` tables for argv prefixes that allow any code (tests of other things)."""
    return "".join(f'\n[[execution.allow]]\nargv = {json.dumps(p)}\ncode = "any"\n' for p in prefixes)
