"""What a human approving a command sees beyond its argv: the programs it resolves to, and what changed.

Three things decide whether a run is what the human thinks it is, and a commit hash shows none of them:

- **the programs**: every executable the argv names, resolved the way the launch resolves it (the run's
  ``PATH``, a link followed to its target) and hashed. `resolve_executables` gives them; the request's code
  binding carries them, so replacing ``<ws>/bin/python`` after the approval changes the digest and the run
  is refused or asked again;
- **the code**: every importable file of the workspace (`perfgate.envprobe.codefiles.importable_files`:
  tracked or not, ignored or not), hashed into one `CodeTree`. The tree's digest is bound too, and the
  files' text is kept in the trust root (`ChangeStore`), so the diff the human reads is drawn from exactly
  the content the approval binds, never from a second look at the disk;
- **the difference**: that tree against the last tree a human approved in this workspace, or, before any
  approval, against the git commit checked out (read with ``git ls-tree`` / ``git cat-file``, which run no
  filter, textconv or hook). A one-line monkeypatch committed in an imported helper shows as its diff line.

`change_view` renders it: first the lines that decide (programs inside the workspace, code reaching into
perfgate's internals, importable files git does not track, which files changed), then the bounded diff
(`MAX_DIFF_LINES`, `MAX_DIFF_FILES`, with what was left out counted). Control characters in file text and
names are shown escaped, so a file cannot redraw the human's terminal.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import json
import os
import re
import shutil
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath

from perfgate.envprobe.fixed import run_fixed
from perfgate.execution.target import command_target, user_argv

__all__ = [
    "MAX_DIFF_FILES",
    "MAX_DIFF_LINES",
    "ChangeStore",
    "CodeTree",
    "Executable",
    "change_view",
    "code_tree",
    "commit_changes",
    "commit_exists",
    "commit_file",
    "git_output",
    "internal_references",
    "resolve_executables",
]

MAX_DIFF_LINES = 150
"""Diff lines an approval shows at most (the rest is counted: "N more lines not shown")."""
MAX_DIFF_FILES = 12
"""Changed files whose diff an approval shows at most (the others are listed by name and counted)."""
MAX_LISTED = 20
"""Names listed per line of the lead (changed files, untracked files, internal references)."""
MAX_BLOB_BYTES = 512 * 1024
"""Text files up to this size are kept for diffs; larger or binary files are compared by digest only."""
MAX_HASH_BYTES = 64 * 1024 * 1024
"""Files above this size are bound by size and mtime instead of content (data, not code)."""
_GIT_TIMEOUT_S = 20.0
_GIT_SAFETY = (
    "-c",
    "core.fsmonitor=false",
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.pager=cat",
    "--no-pager",
)
_GIT_ENV = {
    "GIT_OPTIONAL_LOCKS": "0",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_CONFIG_NOSYSTEM": "1",
    "LC_ALL": "C",
    "GIT_PAGER": "cat",
}
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_DOTTED = re.compile(r"\bperfgate((?:[ \t]*\.[ \t]*[A-Za-z_]\w*)+)")
_FROM_IMPORT = re.compile(
    r"^[ \t]*from[ \t]+(perfgate(?:[ \t]*\.[ \t]*\w+)*)[ \t]+import[ \t]+\(?([^)#\n]*)", re.M
)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 256 else f"\\u{code:04x}"


_UNSEEN = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
"""Unicode categories a screen does not show as themselves: controls, format characters (zero-width
spaces and joiners, direction marks and overrides, the byte-order mark), surrogates, private and
unassigned code points, line and paragraph separators."""


def _clean(text: str) -> str:
    """``text`` with control, invisible and direction-changing characters shown as escapes."""
    if text.isascii():
        return _CONTROL.sub(_escape, text)
    return "".join(
        (f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}")
        if ch != "\t" and unicodedata.category(ch) in _UNSEEN
        else ch
        for ch in text
    )


def _sha256(path: Path) -> str:
    return sha256_or_stamp(path, MAX_HASH_BYTES)


def sha256_or_stamp(path: Path, max_bytes: int) -> str:
    """sha256 (hex) of a file; above ``max_bytes`` (data, not code) its size and mtime stand in."""
    try:
        st = path.stat()
        if st.st_size > max_bytes:
            return f"size={st.st_size};mtime_ns={st.st_mtime_ns}"
        h = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        return h.hexdigest()
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"


# --------------------------------------------------------------------------- programs


@dataclass(frozen=True)
class Executable:
    """A program the argv names: where the launch finds it, what that resolves to, its content digest."""

    name: str
    path: str
    target: str
    sha256: str

    def bound(self) -> str:
        """The value the code binding keeps for ``path``: a changed target or content changes it."""
        return self.sha256 if self.target == self.path else f"{self.sha256} -> {self.target}"


def _program_names(argv: Sequence[str]) -> list[str]:
    names = [argv[0]]
    user = user_argv(argv)
    if user and user[0] not in names:
        names.append(user[0])
    target = command_target(argv)
    if target is not None and target.kind == "program" and target.name not in names:
        names.append(target.name)
    return names


def resolve_executables(argv: Sequence[str], cwd: Path, env: Mapping[str, str]) -> list[Executable]:
    """The programs ``argv`` names (the launcher, the user's program, a torchrun ``--no-python`` target),
    resolved as the launch resolves them: a name with a slash against ``cwd``, a bare name on the run's
    ``PATH`` (``env``: the server's environment with the request's changes). Unresolvable names are left
    out (the launch refuses them)."""
    found: list[Executable] = []
    for name in _program_names(argv):
        if "/" in name:
            candidate = Path(name) if Path(name).is_absolute() else cwd / name
            path = str(candidate) if candidate.is_file() else None
        else:
            path = shutil.which(name, path=env.get("PATH", os.defpath))
        if path is None:
            continue
        absolute = os.path.abspath(path)
        target = os.path.realpath(absolute)
        found.append(Executable(name, absolute, target, _sha256(Path(target))))
    return found


# --------------------------------------------------------------------------- the code tree


@dataclass(frozen=True)
class CodeTree:
    """Every importable file of a workspace: relative path -> (sha256, git blob id)."""

    files: dict[str, tuple[str, str]]
    notes: tuple[str, ...] = ()
    internal: tuple[str, ...] = ()
    """``path:line name`` of each reference to perfgate's internals (`internal_references`), filled in
    when the tree is kept (`ChangeStore.save`), from the files' own text."""

    @property
    def digest(self) -> str:
        text = json.dumps(sorted((k, v[0]) for k, v in self.files.items()), separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def _tree_suffixes() -> frozenset[str]:
    from perfgate.envprobe.codefiles import IMPORTABLE_SUFFIXES
    from perfgate.envprobe.provenance import CODE_SUFFIXES

    return IMPORTABLE_SUFFIXES | CODE_SUFFIXES


def code_tree(workspace: Path, texts: dict[str, bytes] | None = None) -> CodeTree:
    """The importable files of ``workspace`` with their digests; ``texts`` (when given) receives the
    content of each text file up to `MAX_BLOB_BYTES`, read in the same pass that hashed it."""
    from perfgate.envprobe.codefiles import importable_files

    rels, notes = importable_files(workspace, _tree_suffixes())
    files: dict[str, tuple[str, str]] = {}
    for rel in rels:
        path = workspace / rel
        try:
            size = path.stat().st_size
            if size > MAX_HASH_BYTES:
                files[rel] = (_sha256(path), "")
                continue
            data = path.read_bytes()
        except OSError as exc:
            files[rel] = (f"unreadable ({exc.strerror or exc})", "")
            continue
        oid = hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()
        files[rel] = (hashlib.sha256(data).hexdigest(), oid)
        if texts is not None and len(data) <= MAX_BLOB_BYTES and b"\0" not in data:
            texts[rel] = data
    return CodeTree(files, tuple(notes))


class ChangeStore:
    """Approved code, kept in the workspace's trust-root folder (``<trust>/.../code/``).

    ``trees/<digest>.json`` lists a tree's files; ``blobs/<sha256>`` holds a text file's content (secrets
    scrubbed: it is kept for showing, not for running); ``last-approved.json`` names the tree of the latest
    grant, the base the next approval's diff is drawn against.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _private(self, path: Path) -> Path:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        return path

    def keep_diff(self, digest: str, lines: Sequence[str]) -> Path:
        """Write the whole diff an approval of tree ``digest`` could not show, for the human to read."""
        path = self._private(self.folder / "diffs") / f"{digest}.diff"
        _write_private(path, ("\n".join(lines) + "\n").encode())
        return path

    def save(self, tree: CodeTree, texts: Mapping[str, bytes]) -> None:
        """Keep ``tree`` and the text of its files; a file's content is scrubbed and scanned for perfgate
        internals once (what is kept already is not written or read again)."""
        from perfgate.security.scrubber import Scrubber

        manifest = self._private(self.folder / "trees") / f"{tree.digest}.json"
        if manifest.exists():
            return
        blobs = self._private(self.folder / "blobs")
        scrub = Scrubber()
        internal: list[str] = []
        for rel, data in sorted(texts.items()):
            digest = tree.files[rel][0]
            if hashlib.sha256(data).hexdigest() != digest:
                continue  # changed between hashing and now: the view shows it as not kept
            target = blobs / digest
            refs_file = blobs / f"{digest}.internal"
            if not target.exists():
                refs = (
                    internal_references(data.decode("utf-8", errors="replace")) if rel.endswith(".py") else []
                )
                _write_private(refs_file, json.dumps(refs).encode())
                _write_private(target, scrub.text(data.decode("utf-8", errors="replace")).encode())
            found: list[tuple[int, str]] = []
            if rel.endswith(".py"):
                try:
                    found = [(int(x[0]), str(x[1])) for x in json.loads(refs_file.read_text())]
                except (OSError, ValueError, TypeError, IndexError):
                    found = internal_references(data.decode("utf-8", errors="replace"))
            internal += [f"{rel}:{line} {name}" for line, name in found]
        body = {
            "files": {k: list(v) for k, v in sorted(tree.files.items())},
            "notes": list(tree.notes),
            "internal": internal,
        }
        _write_private(manifest, json.dumps(body).encode())

    def tree(self, digest: str) -> CodeTree | None:
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            return None
        try:
            body = json.loads((self.folder / "trees" / f"{digest}.json").read_text())
            files = {str(k): (str(v[0]), str(v[1])) for k, v in dict(body["files"]).items()}
            return CodeTree(
                files,
                tuple(str(n) for n in body.get("notes", [])),
                tuple(str(n) for n in body.get("internal", [])),
            )
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            return None

    def blob(self, sha256: str) -> str | None:
        if not re.fullmatch(r"[0-9a-f]{64}", sha256):
            return None
        try:
            return (self.folder / "blobs" / sha256).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None

    def mark_approved(self, tree_digest: str, approval: str, at: float) -> None:
        """Record ``tree_digest`` as the code of the latest grant (``approval``: its id or evidence id)."""
        if not tree_digest:
            return
        body = {"tree": tree_digest, "approval": approval, "at": at}
        _write_private(self._private(self.folder) / "last-approved.json", json.dumps(body).encode())

    def last_approved(self) -> tuple[str, str, float] | None:
        try:
            body = json.loads((self.folder / "last-approved.json").read_text())
            return str(body["tree"]), str(body["approval"]), float(body["at"])
        except (OSError, ValueError, KeyError, TypeError):
            return None


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


# --------------------------------------------------------------------------- git, read only


def _git(workspace: Path, args: list[str], max_bytes: int = 64 << 20) -> bytes | None:
    git = shutil.which("git")
    if git is None:
        return None
    run = run_fixed(
        [git, "-C", str(workspace), *_GIT_SAFETY, *args],
        _GIT_TIMEOUT_S,
        {**os.environ, **_GIT_ENV},
        max_bytes,
    )
    return run.stdout_bytes if run.ok else None


def git_output(workspace: Path, args: list[str], max_bytes: int = 1 << 20) -> bytes | None:
    """The output of a read-only git command in the workspace's repository, run with the safety options
    every read here uses (no hooks, no fsmonitor, no pager); None when git is missing or the command fails."""
    return _git(workspace, args, max_bytes)


_REV = re.compile(r"[0-9a-fA-F]{7,64}")
"""A commit id as git abbreviates or writes it out (sha1 or sha256)."""


def commit_exists(workspace: Path, rev: str) -> bool:
    """``rev`` (hex, 7 to 64 digits) names a commit of the workspace's git repository (read only)."""
    if not _REV.fullmatch(rev):
        return False
    return _git(workspace, ["cat-file", "-e", f"{rev}^{{commit}}"]) is not None


def commit_file(workspace: Path, commit: str, path: str, max_bytes: int = 4 << 20) -> bytes | None:
    """The bytes of ``path`` (relative to the workspace) at ``commit``, read only; None when it is absent
    there, binary or over ``max_bytes``, or git cannot say."""
    if not _REV.fullmatch(commit):
        return None
    data = _git(workspace, ["cat-file", "blob", f"{commit}:./{path}"], max_bytes + 1)
    return None if data is None or len(data) > max_bytes or b"\0" in data else data


def commit_changes(
    workspace: Path, old: str, new: str, max_files: int = 256, max_bytes: int = 4 << 20
) -> tuple[dict[str, tuple[bytes | None, bytes | None]], str | None]:
    """The files that differ between commits ``old`` and ``new`` of the workspace's repository, read only
    (``git diff-tree``, no rename detection, then each blob): path -> (its bytes at ``old``, at ``new``;
    None where it is absent, not a file, binary or over ``max_bytes``). Second: why they could not be
    listed (git missing, a commit the repository does not hold, more than ``max_files`` changed), else
    None."""
    for rev in (old, new):
        if not commit_exists(workspace, rev):
            return {}, f"commit {rev[:12]!r} is not in the workspace's git repository"
    raw = _git(workspace, ["diff-tree", "-r", "-z", "--no-renames", old, new])
    if raw is None:
        return {}, "git diff-tree failed"
    fields = raw.split(b"\0")
    entries = [(fields[i], fields[i + 1]) for i in range(0, len(fields) - 1, 2) if fields[i].startswith(b":")]
    if len(entries) > max_files:
        return {}, f"{len(entries)} files changed, more than the {max_files} read"

    def blob(mode: str, oid: str) -> bytes | None:
        if not oid.strip("0") or not mode.startswith("100"):  # absent (all zeros), a link or a submodule
            return None
        data = _git(workspace, ["cat-file", "blob", oid], max_bytes + 1)
        return None if data is None or len(data) > max_bytes or b"\0" in data else data

    out: dict[str, tuple[bytes | None, bytes | None]] = {}
    for meta, name in entries:
        parts = meta.decode("ascii", "replace")[1:].split()
        if len(parts) < 5:
            continue
        rel = name.decode("utf-8", "surrogateescape")
        out[rel] = (blob(parts[0], parts[2]), blob(parts[1], parts[3]))
    return out, None


def _head(workspace: Path, rev: str = "HEAD") -> tuple[str, dict[str, str]] | None:
    """The commit checked out (or ``rev``) and its files under ``workspace`` (relative path -> blob id)."""
    commit = _git(workspace, ["rev-parse", "--verify", "-q", rev])
    listing = _git(workspace, ["ls-tree", "-r", "-z", rev])
    if not commit or listing is None:
        return None
    files: dict[str, str] = {}
    for entry in listing.decode("utf-8", "surrogateescape").split("\0"):
        meta, _, rel = entry.partition("\t")
        parts = meta.split()
        if rel and len(parts) == 3 and parts[1] == "blob":
            files[rel] = parts[2]
    return commit.decode().strip(), files


def _tracked(workspace: Path) -> set[str] | None:
    listing = _git(workspace, ["ls-files", "-z"])
    if listing is None:
        return None
    return {rel for rel in listing.decode("utf-8", "surrogateescape").split("\0") if rel}


# --------------------------------------------------------------------------- perfgate's internals


def _public_harness() -> frozenset[str]:
    import perfgate.harness

    return frozenset(perfgate.harness.__all__)


def _internal(dotted: str, public: frozenset[str]) -> bool:
    parts = [p.strip() for p in dotted.split(".")]
    if parts[0] != "perfgate" or len(parts) == 1 or parts[1].startswith("__"):
        return False
    if parts[1] != "harness":
        return True
    return len(parts) > 2 and parts[2] not in public


def _from_imports(text: str) -> list[tuple[int, str, str]]:
    """(line, module, name) of each ``from perfgate... import name`` (a file that does not parse: the
    one-line form, read by pattern)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return [
            (text.count("\n", 0, m.start()) + 1, re.sub(r"\s+", "", m.group(1)), name.strip().split(" ")[0])
            for m in _FROM_IMPORT.finditer(text)
            for name in m.group(2).split(",")
            if name.strip()
        ]
    return [
        (node.lineno, node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
        if node.module.split(".")[0] == "perfgate"
        for alias in node.names
    ]


def internal_references(text: str) -> list[tuple[int, str]]:
    """(line, name) of each reference ``text`` makes to a perfgate module or name outside the public
    harness API (``perfgate.harness`` and its ``__all__``): imports, attribute chains and strings such as
    ``importlib.import_module("perfgate.harness.window")``. Names built at run time are not seen."""
    if "perfgate" not in text:
        return []
    public = _public_harness()
    found: dict[tuple[int, str], None] = {}
    for match in _DOTTED.finditer(text):
        dotted = "perfgate" + re.sub(r"\s+", "", match.group(1))
        if _internal(dotted, public):
            found[(text.count("\n", 0, match.start()) + 1, dotted)] = None
    for line, module, name in _from_imports(text):
        dotted = f"{module}.{name}"
        if _internal(dotted, public) and not _internal(module, public):
            found[(line, dotted)] = None
    return sorted(found)


# --------------------------------------------------------------------------- the view


@dataclass(frozen=True)
class _Base:
    label: str
    files: dict[str, str]  # rel -> sha256 (approved tree) or git blob id (commit)
    by_oid: bool
    commit: str | None = None


def _utc(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, timezone.utc).isoformat(timespec="seconds")


def _names(paths: Sequence[str]) -> str:
    shown = ", ".join(_clean(p) for p in paths[:MAX_LISTED])
    return shown + (f", and {len(paths) - MAX_LISTED} more" if len(paths) > MAX_LISTED else "")


def _base(store: ChangeStore, workspace: Path, current: str, against: str | None = None) -> _Base | None:
    last = store.last_approved() if against is None else None
    if last is not None:
        tree = store.tree(last[0])
        if tree is not None:
            label = f"the last approved run ({last[1]}, {_utc(last[2])})"
            return _Base(label, {k: v[0] for k, v in tree.files.items()}, by_oid=False)
    head = _head(workspace, against or "HEAD")
    if head is None:
        return None
    suffixes = _tree_suffixes()
    files = {rel: oid for rel, oid in head[1].items() if PurePosixPath(rel).suffix in suffixes}
    why = "the paired run's baseline" if against else "no run approved in this workspace yet"
    return _Base(f"commit {head[0][:12]} ({why})", files, True, head[0])


def _old_text(store: ChangeStore, workspace: Path, base: _Base, rel: str) -> str | None:
    key = base.files.get(rel)
    if key is None:
        return ""
    if not base.by_oid:
        return store.blob(key)
    data = _git(workspace, ["cat-file", "blob", key], MAX_BLOB_BYTES + 1)
    if data is None or len(data) > MAX_BLOB_BYTES or b"\0" in data:
        return None
    from perfgate.security.scrubber import Scrubber

    return Scrubber().text(data.decode("utf-8", errors="replace"))


def change_view(
    code_tree_digest: str,
    executables: Mapping[str, str],
    workspace: Path,
    store: ChangeStore,
    against: str | None = None,
) -> tuple[list[str], list[str]]:
    """(lead lines, diff lines) for an approval of code ``code_tree_digest`` running ``executables``
    (the code binding's path -> value), the diff drawn against commit ``against`` (a paired run's baseline)
    or else the last approved tree. Lead lines marked ``!`` need the human's attention."""
    alerts: list[str] = []
    plain: list[str] = []
    for path, value in sorted(executables.items()):
        sha, _, target = value.partition(" -> ")
        where = f"{_clean(path)}" + (f" -> {_clean(target)}" if target else "")
        inside = any(_inside(Path(p), workspace) for p in (path, target) if p)
        line = f"program {where} (sha256 {sha[:16]})"
        if inside:
            alerts.append(f"! {line}: a file in the workspace, which the agent can write")
        else:
            plain.append(line)
    tree = store.tree(code_tree_digest)
    if tree is None:
        return [*alerts, "code: the approved code's files were not kept; only its digest binds", *plain], []
    refs = list(tree.internal)
    if refs:
        alerts.append(
            f"! code reaches into perfgate's internals (only perfgate.harness's public names are meant for "
            f"training code; these can alter what the harness measures): {_names(refs)}"
        )
    tracked = _tracked(workspace)
    if tracked is not None:
        untracked = [rel for rel in sorted(tree.files) if rel not in tracked]
        if untracked:
            alerts.append(f"! importable files git does not track (they run too): {_names(untracked)}")
    base = _base(store, workspace, code_tree_digest, against)
    diff: list[str] = []
    if base is None:
        plain.insert(
            0, f"code: {len(tree.files)} importable files; no approved run or commit to compare with"
        )
    else:
        current = {k: (v[1] if base.by_oid else v[0]) for k, v in tree.files.items()}
        changed = sorted(
            rel for rel in set(current) | set(base.files) if current.get(rel) != base.files.get(rel)
        )
        if not changed:
            plain.insert(0, f"code: no change since {base.label}")
        else:
            diff, counts, hidden, whole = _diff(store, workspace, base, tree, changed)
            listed = [f"{rel} ({counts.get(rel, 'binary or large')})" for rel in changed]
            plain.insert(0, f"code: {len(changed)} file(s) changed since {base.label}: {_names(listed)}")
            if hidden:
                where = store.keep_diff(code_tree_digest, whole)
                alerts += [
                    f"! {_clean(rel)}: {n} added line(s) not shown here; the whole diff is in {where}"
                    for rel, n in hidden.items()
                ]
    notes = [f"note: {_clean(n)}" for n in tree.notes]
    return [*alerts, *plain, *notes], diff


def _inside(path: Path, workspace: Path) -> bool:
    try:
        resolved = path.resolve()
    except OSError:
        return False
    return resolved == workspace or workspace in resolved.parents or workspace in path.parents


def _diff(
    store: ChangeStore, workspace: Path, base: _Base, tree: CodeTree, changed: list[str]
) -> tuple[list[str], dict[str, str], dict[str, int], list[str]]:
    """(the diff lines shown, each file's counts, file -> added lines left off the screen, the whole diff)."""
    lines: list[str] = []
    whole: list[str] = []
    counts: dict[str, str] = {}
    hidden: dict[str, int] = {}
    left_lines = 0
    left_files: list[str] = []
    for index, rel in enumerate(changed):
        entry = tree.files.get(rel)
        new = "" if entry is None else store.blob(entry[0])
        old = _old_text(store, workspace, base, rel)
        if new is None or old is None:
            continue
        body = list(
            difflib.unified_diff(old.splitlines(), new.splitlines(), f"a/{rel}", f"b/{rel}", lineterm="", n=2)
        )
        added = sum(1 for x in body[2:] if x.startswith("+"))
        removed = sum(1 for x in body[2:] if x.startswith("-"))
        counts[rel] = f"+{added} -{removed}" if entry is not None else f"removed, -{removed}"
        cleaned = [_clean(x) for x in body]
        whole += cleaned
        room = 0 if index >= MAX_DIFF_FILES else max(0, MAX_DIFF_LINES - len(lines))
        if room == 0 and index >= MAX_DIFF_FILES:
            left_files.append(rel)
        lines += cleaned[:room]
        left_lines += max(0, len(body) - room)
        if unseen := sum(1 for x in body[max(room, 2) :] if x.startswith("+")):
            hidden[rel] = unseen
    if left_lines or left_files:
        lines.append(
            f"... {left_lines} more diff lines and {len(left_files)} more files not shown"
            + (f" ({_names(left_files)})" if left_files else "")
        )
    return lines, counts, hidden, whole
