"""What a launched run was: its argv, env changes, the workspace's code state and the files argv names.

Recorded with every benchmark window so a comparison can diff baseline against candidate field by field.
The code state is the git commit plus a digest of the dirty diff (and per-file digests of its sections,
so a comparison can name the paths that differ); workspace files named in argv (the script, configs,
untracked files included) are digested directly. `run_provenance` records the whole block.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from perfgate.benchmarking.workload.outputs import ArgvPath, argv_paths

if TYPE_CHECKING:
    from perfgate.execution.service import ArtifactWriter

__all__ = [
    "CodeState",
    "RunProvenance",
    "argv_files",
    "code_differences",
    "diff_sections",
    "file_sha256",
    "run_code_scope",
    "run_provenance",
    "workspace_relative",
]

_MAX_FILE_BYTES = 64 * 1024 * 1024
_SECTION = re.compile(rb"^diff --git a/(.*?) b/(.*?)$", re.MULTILINE)


def file_sha256(path: Path) -> str | None:
    try:
        if not path.is_file() or path.stat().st_size > _MAX_FILE_BYTES:
            return None
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def argv_files(argv: Sequence[str], cwd: Path, workspace: Path) -> dict[str, str]:
    """sha256 of each existing file inside ``workspace`` that an argv token (or ``--opt=value``) names.

    Keys are paths relative to the workspace. Files outside the workspace (the interpreter) are skipped.
    """
    out: dict[str, str] = {}
    root = workspace.resolve()
    for token in argv:
        for candidate in {token, token.split("=", 1)[1] if "=" in token else token}:
            if not candidate or candidate.startswith("-") or len(candidate) > 4096:
                continue
            try:
                path = (cwd / candidate).resolve()
                rel = path.relative_to(root)
            except (OSError, ValueError):
                continue
            if rel.parts and rel.parts[0] == ".perfgate":
                continue
            digest = file_sha256(path)
            if digest is not None:
                out[rel.as_posix()] = digest
    return dict(sorted(out.items()))


def diff_sections(diff: bytes) -> dict[str, str]:
    """Per-path sha256 of the sections of a ``git diff`` (path -> digest of that file's hunks)."""
    starts = [(m.start(), m.group(2).decode("utf-8", "replace")) for m in _SECTION.finditer(diff)]
    out: dict[str, str] = {}
    for i, (start, path) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(diff)
        out[path] = hashlib.sha256(diff[start:end]).hexdigest()
    return out


def code_differences(base: Mapping[str, Any], cand: Mapping[str, Any]) -> list[str]:
    """Paths whose code differs between two recorded code states (commit change listed as 'commit')."""
    paths: list[str] = []
    if base.get("commit") != cand.get("commit"):
        paths.append("commit")
    b_files: Mapping[str, Any] = base.get("diff_files") or {}
    c_files: Mapping[str, Any] = cand.get("diff_files") or {}
    paths += sorted(p for p in set(b_files) | set(c_files) if b_files.get(p) != c_files.get(p))
    return paths


def run_code_scope(
    argv: Sequence[str], cwd: Path, env: Mapping[str, str], workspace: Path
) -> tuple[list[Path], list[Path]]:
    """Where a run's code comes from beyond the workspace's own files: its import roots (the script's
    folder, ``cwd``, ``PYTHONPATH`` entries of ``env``) and the programs its argv names, resolved on the
    run's ``PATH`` (``env`` over the server's). The code state binds what lies in the workspace."""
    from perfgate.envprobe.codefiles import import_roots, resolve_program
    from perfgate.execution.target import command_target, user_argv

    target = command_target(argv)
    script = target.file(cwd) if target is not None and target.kind == "script" else None
    path_value = env.get("PATH", os.environ.get("PATH"))
    names = dict.fromkeys([argv[0], *user_argv(argv)[:1]] if argv else [])
    if target is not None and target.kind == "program":
        names[target.name] = None
    programs = [p for name in names if (p := resolve_program(name, cwd, path_value)) is not None]
    return import_roots(workspace, cwd, script, env), programs


class CodeState(BaseModel):
    commit: str | None = Field(description="git commit of the workspace at launch; null when unknown.")
    dirty: bool | None = Field(
        description="Uncommitted changes to tracked files, untracked files, or files the run can import or "
        "execute that no commit holds (ignored ones included)."
    )
    diff_sha256: str | None = Field(
        description="sha256 of the diff against HEAD, read without running git; files that can run and no "
        "commit holds appear in it as new files."
    )
    diff_files: dict[str, str] = Field(description="Path -> sha256 of that path's section of the diff.")
    diff_artifact: str | None = Field(description="The dirty diff itself, as an artifact of this evidence.")
    unknown_reason: str | None = Field(
        description="Why the code state is unknown (no git, not a repository)."
    )


class RunProvenance(BaseModel):
    argv: list[str] = Field(description="The training command as given (before the harness wrapper).")
    cwd: str
    env_changes: list[str] = Field(description="Names of the environment variables this run set.")
    code: CodeState
    files: dict[str, str] = Field(
        description="sha256 of each workspace file the argv names (script, configs; untracked included)."
    )
    argv_paths: list[ArgvPath] = Field(
        default_factory=list[ArgvPath],
        description="The option values of argv read as paths, stamped before the first launch: the run's "
        "outputs are those it wrote (perfgate.benchmarking.workload.outputs).",
    )


def workspace_relative(path: Path, workspace: Path) -> str:
    """A path as records show it: relative to the workspace when inside it."""
    try:
        return str(path.relative_to(workspace))
    except ValueError:
        return str(path)


def run_provenance(
    argv: Sequence[str],
    cwd_name: str,
    cwd: Path,
    env: Mapping[str, str],
    workspace: Path,
    artifacts: ArtifactWriter,
) -> RunProvenance:
    """A launched run's argv, env change names, code state (git; the dirty diff as the artifact
    ``code.diff``) and digests of the workspace files argv names, its option values stamped as paths: every run perfgate
    launches records this.

    ``cwd_name`` is the working directory as given, ``cwd`` where it resolved to.
    """
    from perfgate.envprobe import git_snapshot

    command = list(argv)
    roots, programs = run_code_scope(command, cwd, env, workspace)
    snapshot, reason = git_snapshot(workspace, roots=roots, programs=programs)
    artifact: str | None = None
    if snapshot is not None and snapshot.diff:
        from perfgate.security.scrubber import Scrubber, scrub_bytes

        # stored without the secrets it holds or the run was given (diff_sha256 binds the real bytes)
        scrubbed = scrub_bytes(snapshot.diff, Scrubber.for_values(env, command))
        artifact = workspace_relative(artifacts.write_bytes("code.diff", scrubbed), workspace)
    code = CodeState(
        commit=snapshot.commit if snapshot else None,
        dirty=snapshot.dirty if snapshot else None,
        diff_sha256=snapshot.diff_sha256 if snapshot else None,
        diff_files=diff_sections(snapshot.diff) if snapshot else {},
        diff_artifact=artifact,
        unknown_reason=reason,
    )
    return RunProvenance(
        argv=command,
        cwd=cwd_name,
        env_changes=sorted(env),
        code=code,
        files=argv_files(command, cwd, workspace),
        argv_paths=argv_paths(command, cwd, workspace),
    )
