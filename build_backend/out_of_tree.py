"""perfgate's build backend: setuptools, run on a copy of the source tree, so `pip install .` leaves no
``build/`` or ``*.egg-info`` in the user's checkout (setuptools writes both beside the sources).

Wheels, sdists and their metadata are built in a temporary copy (what git would track: ``.git``, virtual
environments, caches and earlier build output are left out) and handed back in the folder the frontend
named. An editable install keeps setuptools' own hook: it points at these sources and writes nothing here.
Stdlib and setuptools only (PEP 517 ``backend-path``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import (
    build_editable,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_editable,
)

__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "prepare_metadata_for_build_wheel",
]

_LEFT_OUT = shutil.ignore_patterns(
    ".git", ".venv", "venv", "build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".perfgate", ".*_cache"
)


@contextlib.contextmanager
def _in_copy() -> Generator[None]:
    source = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="perfgate-build-") as tmp:
        copy = Path(tmp) / "src-tree"
        shutil.copytree(source, copy, ignore=_LEFT_OUT, symlinks=True)
        os.chdir(copy)
        try:
            yield
        finally:
            os.chdir(source)


def build_wheel(
    wheel_directory: str,
    config_settings: Mapping[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    out = os.path.abspath(wheel_directory)
    meta = os.path.abspath(metadata_directory) if metadata_directory else None
    with _in_copy():
        return _setuptools.build_wheel(out, config_settings, meta)  # pyright: ignore[reportArgumentType]


def build_sdist(sdist_directory: str, config_settings: Mapping[str, Any] | None = None) -> str:
    out = os.path.abspath(sdist_directory)
    with _in_copy():
        return _setuptools.build_sdist(out, config_settings)  # pyright: ignore[reportArgumentType]


def prepare_metadata_for_build_wheel(
    metadata_directory: str, config_settings: Mapping[str, Any] | None = None
) -> str:
    out = os.path.abspath(metadata_directory)
    with _in_copy():
        return _setuptools.prepare_metadata_for_build_wheel(out, config_settings)  # pyright: ignore[reportArgumentType]
