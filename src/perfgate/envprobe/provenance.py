"""Provenance: the source tree (git) and the container a run starts from.

git runs with a fixed argv and settings that keep a repository's own configuration from executing
programs: no fsmonitor, no hooks, no external diff drivers or text conversion, no optional locks (status
does not rewrite the index), no pager, no prompts. Clean filters a repository configures (git-lfs, for
example) still run, exactly as they do on any ``git status`` the user types.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from perfgate.envprobe.models import ContainerProvenance
from perfgate.envprobe.ownfiles import is_own_path, own_pathspecs
from perfgate.envprobe.systools import RawRun, run_fixed

__all__ = ["CODE_SUFFIXES", "CodeState", "GitSnapshot", "code_state", "container_provenance", "git_snapshot"]

_GIT_SAFETY = (
    "-c",
    "core.fsmonitor=false",
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.pager=cat",
    "-c",
    "diff.external=",
    "--no-pager",
)
_GIT_ENV = {"GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C", "GIT_PAGER": "cat"}
_STATE_DIR = ".perfgate/"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_CONTAINER_ID = re.compile(
    r"(?:docker[-/]|cri-containerd-|containerd[-/]|crio-|libpod-|/containers/)([0-9a-f]{64})"
)


@dataclass(frozen=True)
class GitSnapshot:
    """What git said about the workspace; ``diff`` holds the raw bytes of ``git diff --binary HEAD``."""

    root: str
    commit: str | None
    branch: str | None
    changed_files: int
    untracked_files: int
    diff: bytes
    notes: tuple[str, ...] = ()

    @property
    def dirty(self) -> bool:
        return self.changed_files > 0 or self.untracked_files > 0

    @property
    def diff_sha256(self) -> str:
        return hashlib.sha256(self.diff).hexdigest()


def _git(
    git: str,
    workspace: Path,
    args: list[str],
    timeout_s: float,
    env: Mapping[str, str],
    max_bytes: int = 1 << 20,
) -> RawRun:
    return run_fixed([git, "-C", str(workspace), *_GIT_SAFETY, *args], timeout_s, env, max_bytes)


def git_snapshot(
    workspace: Path,
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
    max_diff_bytes: int = 64 * 1024 * 1024,
) -> tuple[GitSnapshot | None, str | None]:
    """Commit, branch, dirty state and diff of the repository holding ``workspace``.

    Returns (snapshot, None) or (None, reason) when there is no git, no repository, or git refuses it
    (for example a repository owned by another user).
    """
    base_env = dict(os.environ if env is None else env)
    git = shutil.which("git", path=base_env.get("PATH"))
    if git is None:
        return None, "git is not installed (not found on PATH)"
    git_env = {**base_env, **_GIT_ENV}
    top = _git(git, workspace, ["rev-parse", "--show-toplevel"], timeout_s, git_env)
    if not top.ok:
        reason = top.describe_failure()
        if "not a git repository" in (top.stderr + top.stdout).lower():
            return None, f"the workspace {workspace} is not inside a git repository"
        return None, f"git could not read the workspace: {reason}"
    root = top.stdout.strip()
    # perfgate's own files (the ledger, a harness copy) are never the user's code, committed or not
    own = own_pathspecs(root, workspace)
    notes: list[str] = []
    head = _git(git, workspace, ["rev-parse", "--verify", "-q", "HEAD"], timeout_s, git_env)
    commit = head.stdout.strip() if head.ok and head.stdout.strip() else None
    if commit is None:
        notes.append("the repository has no commit yet (unborn HEAD)")
    branch_run = _git(git, workspace, ["symbolic-ref", "-q", "--short", "HEAD"], timeout_s, git_env)
    branch = branch_run.stdout.strip() if branch_run.ok and branch_run.stdout.strip() else None
    status = _git(
        git,
        workspace,
        ["status", "--porcelain=v1", "-z", "--untracked-files=normal", "--", *own],
        timeout_s,
        git_env,
    )
    changed = untracked = 0
    if status.ok:
        for entry in status.stdout.split("\0"):
            if len(entry) < 4:
                continue
            code, path = entry[:2], entry[3:]
            if code == "??":
                if not path.startswith(_STATE_DIR):
                    untracked += 1
            elif code[0] in "MADRCUT" or code[1] in "MADRCUT":
                changed += 1
    else:
        notes.append(f"git status failed: {status.describe_failure()}")
    diff = b""
    if commit is not None:
        diff_run = _git(
            git,
            workspace,
            ["diff", "--binary", "--no-ext-diff", "--no-textconv", "HEAD", "--", *own],
            timeout_s,
            git_env,
        )
        if diff_run.ok:
            diff = diff_run.stdout_bytes
            if len(diff) >= max_diff_bytes:
                notes.append(f"the diff reached the {max_diff_bytes}-byte capture limit and may be truncated")
        else:
            notes.append(f"git diff failed: {diff_run.describe_failure()}")
    return GitSnapshot(root, commit, branch, changed, untracked, diff, tuple(notes)), None


CODE_SUFFIXES = frozenset(
    {
        ".py",
        ".pyx",
        ".pxd",
        ".pyi",
        ".sh",
        ".bash",
        ".c",
        ".cc",
        ".cpp",
        ".cxx",
        ".cu",
        ".cuh",
        ".h",
        ".hpp",
        ".yaml",
        ".yml",
        ".toml",
        ".cfg",
        ".ini",
    }
)
"""Files that count as code when untracked (git) or when the workspace is not a repository. Other
untracked files (checkpoints, logs, data, outputs a run writes) do not change the code state."""
_MAX_TREE_FILES = 20_000
_MAX_HASH_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class CodeState:
    """The code a workspace holds right now, as one digest (what an approval and a run record bind to).

    ``kind`` is ``git`` (commit + sha256 of ``git diff --binary HEAD`` + untracked code files) or ``tree``
    (no repository: every code file under the workspace, by path and content).
    """

    kind: str
    digest: str
    commit: str | None = None
    diff_sha256: str | None = None
    dirty: bool = False
    untracked_code_files: int = 0
    files: int = 0
    notes: tuple[str, ...] = ()

    def short(self) -> str:
        if self.kind == "git":
            head = (self.commit or "no commit")[:12]
            return f"git {head}{' + uncommitted changes' if self.dirty else ''} (code {self.digest[:12]})"
        return f"{self.files} code files (code {self.digest[:12]})"


def _hash_file_into(h: Any, path: Path) -> None:
    try:
        st = path.stat()
        if st.st_size > _MAX_HASH_BYTES:
            h.update(f"size={st.st_size};mtime={st.st_mtime_ns}".encode())
            return
        h.update(hashlib.sha256(path.read_bytes()).hexdigest().encode())
    except OSError as exc:
        h.update(f"unreadable:{exc.errno}".encode())


def _text(path: Path) -> str:
    """A code file's text for its imports ("" when unreadable or larger than code gets)."""
    try:
        if path.stat().st_size > _MAX_HASH_BYTES:
            return ""
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _tree_state(workspace: Path) -> CodeState:
    h = hashlib.sha256(b"tree\n")
    count = 0
    notes: list[str] = []
    for dirpath, dirnames, filenames in os.walk(workspace):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.suffix not in CODE_SUFFIXES or path.is_symlink():
                continue
            if is_own_path(path.relative_to(workspace).as_posix()):
                continue
            count += 1
            if count > _MAX_TREE_FILES:
                notes.append(f"more than {_MAX_TREE_FILES} code files: the rest are not bound")
                break
            h.update(str(path.relative_to(workspace)).encode() + b"\0")
            _hash_file_into(h, path)
            h.update(b"\n")
        if notes:
            break
    return CodeState("tree", h.hexdigest(), files=count, notes=tuple(notes))


def code_state(
    workspace: Path, *, env: Mapping[str, str] | None = None, timeout_s: float = 30.0
) -> CodeState:
    """The workspace's code state: git commit, dirty diff and untracked code files, or a tree digest.

    Untracked files count only when they are code (`CODE_SUFFIXES`), not ignored by git, and importable
    by the run (`perfgate.envprobe.codefiles`: next to tracked code, a package, or imported by code that
    counts), and ``.perfgate/`` never counts, so what a run writes (records, checkpoints, logs) and the
    agent's scratch folders (notes, copies) do not change it.
    """
    snap, _reason = git_snapshot(workspace, env=env, timeout_s=timeout_s)
    if snap is None:
        return _tree_state(workspace)
    h = hashlib.sha256(b"git\n")
    h.update(f"{snap.commit}\n{snap.diff_sha256}\n".encode())
    base_env = dict(os.environ if env is None else env)
    git = shutil.which("git", path=base_env.get("PATH")) or "git"
    listed = _git(
        git,
        workspace,
        ["ls-files", "--others", "--exclude-standard", "-z"],
        timeout_s,
        {**base_env, **_GIT_ENV},
    )
    tracked = _git(git, workspace, ["ls-files", "-z"], timeout_s, {**base_env, **_GIT_ENV})
    untracked = 0
    notes = list(snap.notes)
    if listed.ok and tracked.ok:
        from perfgate.envprobe.codefiles import untracked_code

        tracked_dirs = {""} | {
            "/".join(Path(rel).parts[:i])
            for rel in tracked.stdout.split("\0")
            if rel
            for i in range(1, len(Path(rel).parts))
        }
        candidates = [
            rel
            for rel in listed.stdout.split("\0")
            if rel and not is_own_path(rel) and Path(rel).suffix in CODE_SUFFIXES
        ]
        for rel in untracked_code(candidates, tracked_dirs, snap.diff, lambda rel: _text(workspace / rel)):
            untracked += 1
            h.update(rel.encode() + b"\0")
            _hash_file_into(h, workspace / rel)
            h.update(b"\n")
    else:
        failed = listed if not listed.ok else tracked
        notes.append(f"untracked files could not be listed: {failed.describe_failure()}")
    return CodeState(
        "git",
        h.hexdigest(),
        commit=snap.commit,
        diff_sha256=snap.diff_sha256,
        dirty=snap.changed_files > 0 or untracked > 0,
        untracked_code_files=untracked,
        notes=tuple(notes),
    )


def container_provenance(probe_container: Mapping[str, Any] | None) -> tuple[ContainerProvenance, list[str]]:
    """Container facts from the probe's raw observations (marker files, cgroup, mounts, variables).

    Returns (provenance, reasons for what stayed unknown). The image digest is reported only when a
    runtime file or a variable states one; it is never derived from a container id.
    """
    data: Mapping[str, Any] = probe_container or {}
    sources: list[str] = []
    runtime: str | None = None
    container_id: str | None = None
    image: str | None = None
    digest: str | None = None
    cgroup = str(data.get("cgroup") or "")
    containerenv = data.get("containerenv")
    image_env: Mapping[str, Any] = data.get("image_env") or {}

    if data.get("dockerenv"):
        runtime = "docker"
        sources.append("/.dockerenv exists")
    if isinstance(containerenv, str):
        runtime = "podman"
        sources.append("/run/.containerenv exists")
        fields = dict(re.findall(r'^(\w+)="([^"]*)"', containerenv, re.MULTILINE))
        if fields.get("image"):
            image = fields["image"]
            sources.append("image from /run/.containerenv")
        if fields.get("id"):
            container_id = fields["id"]
    if "kubepods" in cgroup:
        runtime = "kubernetes"
        sources.append("/proc/self/cgroup mentions kubepods")
    elif "cri-containerd" in cgroup or "containerd" in cgroup:
        runtime = runtime or "containerd"
    elif "crio-" in cgroup:
        runtime = runtime or "cri-o"
    if data.get("singularity"):
        runtime = "apptainer"
        sources.append("SINGULARITY_CONTAINER/APPTAINER_CONTAINER is set")
    match = _CONTAINER_ID.search(cgroup)
    if match and container_id is None:
        container_id = match.group(1)
        sources.append("container id from /proc/self/cgroup")
    ids: Any = data.get("mountinfo_container_ids")
    if container_id is None and isinstance(ids, list) and ids:
        container_id = str(cast("list[Any]", ids)[0])
        sources.append("container id from /proc/self/mountinfo")
    for name in (
        "CONTAINER_IMAGE",
        "DOCKER_IMAGE",
        "IMAGE_NAME",
        "ENROOT_IMAGE",
        "SINGULARITY_NAME",
        "APPTAINER_NAME",
    ):
        value = image_env.get(name)
        if value and image is None:
            image = str(value)
            sources.append(f"image from ${name}")
    for name, value in sorted(image_env.items()):
        found = _DIGEST.search(str(value))
        if found and digest is None:
            digest = found.group(0)
            sources.append(f"image digest from ${name}")
    if digest is None and image is not None:
        found = _DIGEST.search(image)
        digest = found.group(0) if found else None
    if image is None and image_env.get("NVIDIA_PYTORCH_VERSION"):
        sources.append(
            f"NGC PyTorch container release {image_env['NVIDIA_PYTORCH_VERSION']} ($NVIDIA_PYTORCH_VERSION)"
        )
    in_container = runtime is not None or container_id is not None
    missing: list[str] = []
    if not in_container:
        missing.append("no container marker (/.dockerenv, /run/.containerenv, container cgroup) was found")
    elif digest is None:
        missing.append(
            "the image digest is not visible from inside the container; export it to the job (e.g. "
            "CONTAINER_IMAGE=repo@sha256:...) or record `docker inspect --format '{{.Image}}'` from the host"
        )
    return (
        ContainerProvenance(
            in_container=in_container,
            runtime=runtime,
            container_id=container_id,
            image=image,
            image_digest=digest,
            sources=sources,
        ),
        missing,
    )
