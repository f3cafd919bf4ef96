"""Bind a request to the code it runs, so an approval covers that code and nothing else.

`bind_code` adds a `CodeBinding` to a request: the sha256 of every file its argv names (the script or
module the harness will run, config files given as arguments) and the workspace's code state (git commit
plus uncommitted changes and the untracked code files a run can import, see `perfgate.envprobe.codefiles`,
or a digest of the code files when the workspace is not a repository). The binding is part of the request's digest, so editing the approved script, committing
something else or adding a module the script imports needs a new approval. The gate binds when it decides,
and the runner binds again right before it starts the process: a change in between is refused.
"""

from __future__ import annotations

import os
from pathlib import Path

from perfgate.execution.changes import ChangeStore, code_tree, resolve_executables, sha256_or_stamp
from perfgate.execution.request import CodeBinding, CommandRequest
from perfgate.execution.target import files_named

__all__ = ["bind_code", "file_sha256"]

_MAX_HASH_BYTES = 256 * 1024 * 1024


def file_sha256(path: Path) -> str:
    """sha256 (hex) of a file; for files above 256 MiB (data, not code) size and mtime stand in."""
    return sha256_or_stamp(path, _MAX_HASH_BYTES)


def bind_code(request: CommandRequest, workspace: Path, store: ChangeStore | None = None) -> CommandRequest:
    """``request`` with its code binding computed now (any earlier binding is replaced).

    The binding also holds the programs the argv resolves to on the run's PATH and the digest of every
    importable file (`perfgate.execution.changes`); with ``store``, those files' text is kept there for
    the approval's diff. A pair's candidate is bound too (its argv may name other files and programs).
    """
    from perfgate.envprobe.provenance import code_state

    if request.paired is not None:
        paired = bind_code(request.paired, workspace, store)
        return bind_code(request.model_copy(update={"paired": None}), workspace, store).model_copy(
            update={"paired": paired}
        )

    state = code_state(workspace)
    files = {str(path): file_sha256(path) for path in files_named(request.argv, request.cwd)}
    summary = state.short() + ("; " + "; ".join(state.notes) if state.notes else "")
    programs = resolve_executables(request.argv, request.cwd, {**os.environ, **request.env})
    texts: dict[str, bytes] | None = {} if store is not None else None
    tree = code_tree(workspace, texts)
    if store is not None and texts is not None:
        store.save(tree, texts)
    binding = CodeBinding(
        files=files,
        workspace=state.digest,
        summary=summary,
        executables={p.path: p.bound() for p in programs},
        tree=tree.digest,
    )
    return request.model_copy(update={"code": binding})
