"""Provenance: the source tree (git) and the container a run starts from.

The source tree is read without running git (`perfgate.envprobe.gitread`): git runs programs a
repository configures (clean filters, text conversion, external diffs, fsmonitor, hooks, pagers), and the
repository is the agent's to write. What Python can import is code whether git tracks it, ignores it or
not (`perfgate.envprobe.codefiles.importable_files`), so such files are bound by their own digest.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from perfgate.envprobe.models import ContainerProvenance

__all__ = [
    "CODE_SUFFIXES",
    "MAX_CODE_BYTES",
    "MAX_CODE_FILES",
    "MAX_HASH_FILE_BYTES",
    "CodeState",
    "GitSnapshot",
    "code_state",
    "container_provenance",
    "git_snapshot",
]

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_CONTAINER_ID = re.compile(
    r"(?:docker[-/]|cri-containerd-|containerd[-/]|crio-|libpod-|/containers/)([0-9a-f]{64})"
)
MAX_CODE_FILES = 50_000
"""Importable files a code state binds at most; past it the state is incomplete (``complete=False``)."""


@dataclass(frozen=True)
class GitSnapshot:
    """The repository's state read without git; ``diff`` is the work tree against HEAD in git's layout.

    ``untracked_files`` counts files neither tracked nor ignored, plus importable files git ignores.
    """

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


def git_snapshot(
    workspace: Path,
    *,
    roots: Sequence[Path] = (),
    programs: Sequence[Path] = (),
    max_diff_bytes: int = 64 * 1024 * 1024,
) -> tuple[GitSnapshot | None, str | None]:
    """Commit, branch, dirty state and diff of the repository holding ``workspace``, read without git.

    Files that can run and no commit holds (`code_state`: importable files of the workspace and ``roots``,
    ``programs`` inside it) make it dirty and appear in the diff as new files. Returns (snapshot, None) or
    (None, reason) when no repository holds the workspace or its data is not readable git data. Nothing
    the repository configures runs, whoever owns it.
    """
    snap, _state, reason = _read(workspace, roots, programs, max_diff_bytes)
    return snap, reason


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
MAX_HASH_FILE_BYTES = 256 * 1024 * 1024
"""A file above this size is bound by its size and mtime, not its content (noted)."""
MAX_CODE_BYTES = 4 * 1024**3
"""Bytes of untracked importable files hashed per code state; past it the state is incomplete."""


@dataclass(frozen=True)
class CodeState:
    """The code a workspace holds right now, as one digest (what an approval and a run record bind to).

    ``kind`` is ``git`` (commit + sha256 of the work tree's diff against HEAD + every file that can run and
    no commit holds) or ``tree`` (no repository: every code file under the workspace, by path and content).
    ``uncommitted``: those files, workspace-relative path -> sha256. ``complete`` is False when a bound
    (`MAX_CODE_FILES`, `MAX_CODE_BYTES`, the walk's depth, `perfgate.envprobe.gitread`'s limits) left files
    out; the notes say which, and the digest differs from any complete state's.
    """

    kind: str
    digest: str
    commit: str | None = None
    diff_sha256: str | None = None
    dirty: bool = False
    untracked_code_files: int = 0
    files: int = 0
    notes: tuple[str, ...] = ()
    uncommitted: Mapping[str, str] = field(default_factory=lambda: dict[str, str]())
    complete: bool = True

    def short(self) -> str:
        lack = "" if self.complete else "; INCOMPLETE (files left out, see notes)"
        if self.kind == "git":
            head = (self.commit or "no commit")[:12]
            extra = f" + {len(self.uncommitted)} uncommitted code files" if self.uncommitted else ""
            changes = " + uncommitted changes" if self.dirty else ""
            return f"git {head}{changes}{extra} (code {self.digest[:12]}){lack}"
        return f"{self.files} code files (code {self.digest[:12]}){lack}"


def _sha256(path: Path) -> str:
    """sha256 of a file's content (a link's target); size and mtime above `MAX_HASH_FILE_BYTES`."""
    try:
        st = path.stat()
        if st.st_size > MAX_HASH_FILE_BYTES:
            return f"size={st.st_size};mtime_ns={st.st_mtime_ns}"
        h = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        return h.hexdigest()
    except OSError as exc:
        return f"unreadable:{exc.errno}"


def _text(path: Path) -> str:
    """A code file's text for its imports ("" when unreadable or larger than code gets)."""
    try:
        if path.stat().st_size > MAX_HASH_FILE_BYTES:
            return ""
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


@dataclass
class _Runnable:
    """Every file that can run: workspace-relative path -> the file (importable files, programs)."""

    files: dict[str, Path] = field(default_factory=lambda: dict[str, Path]())
    notes: list[str] = field(default_factory=lambda: list[str]())
    complete: bool = True


def _runnable(workspace: Path, roots: Sequence[Path], programs: Sequence[Path]) -> _Runnable:
    from perfgate.envprobe.codefiles import importable_files

    out = _Runnable()
    for root in [workspace, *(r.resolve() for r in roots)]:
        if not root.is_relative_to(workspace) or not root.is_dir():
            continue
        rels, notes = importable_files(root, max_files=MAX_CODE_FILES)
        out.notes += notes
        out.complete = out.complete and not notes
        for rel in rels:
            path = root / rel
            out.files.setdefault(path.relative_to(workspace).as_posix(), path)
    for program in programs:
        for path in (Path(os.path.abspath(program)), program.resolve()):
            if path.is_relative_to(workspace) and path.is_file():
                out.files.setdefault(path.relative_to(workspace).as_posix(), path)
    return out


def _bind(files: Mapping[str, Path], notes: list[str]) -> tuple[dict[str, str], bool]:
    """Path -> sha256 for ``files``, within `MAX_CODE_BYTES` (False when the budget ran out)."""
    out: dict[str, str] = {}
    total = 0
    for rel, path in sorted(files.items()):
        with contextlib.suppress(OSError):
            total += min(path.stat().st_size, MAX_HASH_FILE_BYTES)
        if total > MAX_CODE_BYTES:
            notes.append(f"code files pass {MAX_CODE_BYTES} bytes from {rel} on: the rest are not bound")
            return out, False
        out[rel] = _sha256(path)
    return out, True


def _tree_state(workspace: Path, runnable: _Runnable) -> CodeState:
    files: dict[str, Path] = dict(runnable.files)
    notes = list(runnable.notes)
    complete = runnable.complete
    for dirpath, dirnames, filenames in os.walk(workspace):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.suffix not in CODE_SUFFIXES or path.is_symlink():
                continue
            if len(files) > _MAX_TREE_FILES:
                notes.append(f"more than {_MAX_TREE_FILES} code files: the rest are not bound")
                complete = False
                break
            files.setdefault(path.relative_to(workspace).as_posix(), path)
        if not complete:
            break
    bound, within = _bind(files, notes)
    h = hashlib.sha256(b"tree\n")
    for rel, digest in bound.items():
        h.update(f"{rel}\0{digest}\n".encode())
    complete = complete and within
    if not complete:
        h.update(b"incomplete\n")
    return CodeState("tree", h.hexdigest(), files=len(bound), notes=tuple(notes), complete=complete)


def _read(
    workspace: Path, roots: Sequence[Path], programs: Sequence[Path], max_diff_bytes: int
) -> tuple[GitSnapshot | None, CodeState, str | None]:
    from perfgate.envprobe.codefiles import IMPORTABLE_SUFFIXES, untracked_code
    from perfgate.envprobe.gitread import read_work_tree

    ws = workspace.resolve()
    runnable = _runnable(ws, roots, programs)
    tree, reason = read_work_tree(ws, max_diff_bytes=max_diff_bytes)
    if tree is None:
        return None, _tree_state(ws, runnable), reason
    base = tree.root.resolve()
    notes = [*tree.notes, *runnable.notes]

    def in_repo(path: Path) -> str | None:
        full = Path(os.path.abspath(path))
        return full.relative_to(base).as_posix() if full.is_relative_to(base) else None

    # Files that can run and no commit or index entry holds: ignored or not, they are code.
    loose = {rel: path for rel, path in runnable.files.items() if in_repo(path) not in tree.tracked}
    # Other code git does not ignore (configs, shell scripts, sources) counts when a run can reach it.
    tracked_dirs = {""} | {str(p) for rel in tree.tracked for p in Path(rel).parents if str(p) != "."}
    candidates = [
        rel
        for rel in tree.untracked
        if Path(rel).suffix in CODE_SUFFIXES and Path(rel).suffix not in IMPORTABLE_SUFFIXES
    ]
    for rel in untracked_code(candidates, tracked_dirs, tree.diff, lambda rel: _text(base / rel)):
        path = base / rel
        if path.is_relative_to(ws):
            loose.setdefault(path.relative_to(ws).as_posix(), path)
    uncommitted, within = _bind(loose, notes)
    complete = tree.complete and runnable.complete and within
    untracked = set(tree.untracked) | {r for p in loose.values() if (r := in_repo(p)) is not None}
    snap = GitSnapshot(
        str(base),
        tree.commit,
        tree.branch,
        len(tree.changed),
        len(untracked),
        tree.diff + _added_sections(loose, in_repo, max_diff_bytes - len(tree.diff), notes),
        tuple(notes),
    )
    h = hashlib.sha256(b"git\n")
    h.update(f"{snap.commit}\n{snap.diff_sha256}\n".encode())
    for rel, digest in uncommitted.items():
        h.update(f"{rel}\0{digest}\n".encode())
    if not complete:
        h.update(b"incomplete\n")
    state = CodeState(
        "git",
        h.hexdigest(),
        commit=snap.commit,
        diff_sha256=snap.diff_sha256,
        dirty=bool(tree.changed) or bool(uncommitted),
        untracked_code_files=len(uncommitted),
        notes=tuple(notes),
        uncommitted=uncommitted,
        complete=complete,
    )
    return snap, state, reason


def _added_sections(
    loose: Mapping[str, Path], in_repo: Callable[[Path], str | None], budget: int, notes: list[str]
) -> bytes:
    """The recorded diff's sections for files that can run and no commit holds, as new files."""
    from perfgate.envprobe.gitread import added_file_section

    out = b""
    for _rel, path in sorted(loose.items()):
        section = added_file_section(in_repo(path) or _rel, path)
        if len(out) + len(section) > budget:
            notes.append(f"the diff passed its size limit: files from {_rel} on are bound by digest alone")
            break
        out += section
    return out


def code_state(workspace: Path, *, roots: Sequence[Path] = (), programs: Sequence[Path] = ()) -> CodeState:
    """The workspace's code state: git commit, the diff against it and every file that can run and no
    commit holds; or, outside a repository, a digest of every code file.

    Files that can run: every file Python can import from the workspace and from ``roots`` (a run's
    import roots, `perfgate.envprobe.codefiles.import_roots`), tracked or not, ignored or not
    (`perfgate.envprobe.codefiles.importable_files`), and ``programs`` that lie in the workspace (the
    executables a run's argv resolves to). Untracked configs and other code git does not ignore count
    when a run can reach them (`perfgate.envprobe.codefiles.untracked_code`). ``.perfgate/`` and virtual
    environments never count. Nothing the repository configures runs while this reads it.
    """
    _snap, state, _reason = _read(workspace, roots, programs, 64 * 1024 * 1024)
    return state


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
