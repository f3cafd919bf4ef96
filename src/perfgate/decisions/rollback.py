"""A kept change's rollback is judged by what it would undo (the candidate's difference, read by
`perfgate.decisions.rollback_change`), not by the words it uses.

The candidate's difference from the baseline is read from the two sides' recorded runs: the commits
between the baseline's and the candidate's code state, the files their diffs touched, the environment
variables and command-line options that differ. A rollback passes when, read as the shell commands it
names, it undoes every part of that difference:

- ``git revert <ref>...`` (``HEAD``, ``HEAD~1``, a branch, a sha, ``A..B``) covering every commit of
  the candidate's range;
- ``git checkout [<ref>] -- <paths>``, ``git restore [--source <ref>] <paths>``, ``git reset --hard
  <ref>``, ``git stash`` restoring each touched file to the version the baseline ran (checked blob by
  blob), ``git apply -R``/``patch -R`` with a patch file that touches each of them, or ``cp`` of a
  file whose bytes are the baseline's;
- ``NAME=<the baseline's value>`` for a changed variable, ``unset NAME`` for one the candidate added;
- ``--option <the baseline's value>`` for a changed option, the option named for one it added.

A rollback that names something else is refused with the rollback that would work. Where the
difference is not recorded (imported windows, no provenance, no run on a side) the rollback must at
least name something that exists: a commit, a workspace file, or a setting the baseline ran with.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from perfgate.decisions.rollback_change import (
    CandidateChange,
    candidate_change,
    commit_range,
    object_id,
    resolve_commit,
)
from perfgate.decisions.verdict import Check
from perfgate.evidence import EvidenceRecord
from perfgate.evidence.access import as_dict, str_list

__all__ = ["MAX_TOKENS", "rollback_check"]

MAX_TOKENS = 256
"""Tokens of a rollback that are read (a rollback is a few commands, not an essay)."""
MAX_PATCH_BYTES = 4 << 20
"""A patch file a rollback applies is read up to this size for the paths it touches."""
_HEX = re.compile(r"[0-9a-fA-F]{7,64}")
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.S)
_PATCH_PATH = re.compile(rb"^(?:\+\+\+|---) (?:[ab]/)?([^\t\n]+)|^diff --git a/(\S+) b/(\S+)", re.M)
_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "\n"})


@dataclass
class _Effects:
    """What a rollback's commands would do. ``restored``: (source commit or None for HEAD, paths or None
    for every path); ``patched``/``copied``: paths a reverse patch touches, path -> sha256 of the copied
    file; ``mentioned``: every token."""

    reverted: set[str] = field(default_factory=set[str])
    restored: list[tuple[str | None, list[str] | None]] = field(
        default_factory=list[tuple["str | None", "list[str] | None"]]
    )
    patched: set[str] = field(default_factory=set[str])
    copied: dict[str, str] = field(default_factory=dict[str, str])
    assigned: dict[str, str] = field(default_factory=dict[str, str])
    unset: set[str] = field(default_factory=set[str])
    mentioned: list[str] = field(default_factory=list[str])
    unknown: list[str] = field(default_factory=list[str])


def _commands(text: str) -> list[list[str]]:
    lexer = shlex.shlex(text.replace("`", " "), posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = ""
    commands: list[list[str]] = [[]]
    try:
        for i, token in enumerate(lexer):
            if i >= MAX_TOKENS:
                break
            if token in _SEPARATORS or set(token) <= set(";&|"):
                commands.append([])
            else:
                commands[-1].append(token.strip("'\",()"))
    except ValueError:  # an unclosed quote: read what came before it as words
        commands = [[t.strip("'\",;()`") for t in text.split()[:MAX_TOKENS]]]
    return [c for c in commands if c]


def _relative(workspace: Path, token: str) -> str | None:
    """``token`` as a workspace-relative path (it need not exist now); None outside the workspace."""
    if not token or token.startswith("-") or "\0" in token or len(token) > 1000:
        return None
    root = workspace.resolve()
    try:
        path = (root / token).resolve()
    except (OSError, RuntimeError):
        return None
    if path == root:
        return "."
    return str(path.relative_to(root)) if path.is_relative_to(root) else None


def _patch_paths(workspace: Path, token: str) -> set[str]:
    rel = _relative(workspace, token)
    if rel is None or rel == ".":
        return set()
    path = workspace.resolve() / rel
    try:
        if not path.is_file() or path.stat().st_size > MAX_PATCH_BYTES:
            return set()
        data = path.read_bytes()
    except OSError:
        return set()
    out: set[str] = set()
    for m in _PATCH_PATH.finditer(data):
        for group in m.groups():
            if group and group != b"/dev/null":
                out.add(group.decode(errors="replace").strip())
    return out


def _git_effects(workspace: Path, args: list[str], fx: _Effects) -> None:
    while args and args[0] in ("-C", "-c"):
        args = args[2:]
    if not args:
        return
    sub, rest = args[0], args[1:]
    if "--" in rest:
        cut = rest.index("--")
        words, paths = [a for a in rest[:cut] if not a.startswith("-")], rest[cut + 1 :]
    else:
        words, paths = [a for a in rest if not a.startswith("-")], None
    if sub == "revert":
        mainline = {rest[i + 1] for i, a in enumerate(rest[:-1]) if a in ("-m", "--mainline")}
        for word in (w for w in words if w not in mainline):
            old, dots, new = word.partition("..")
            if dots:
                a, b = resolve_commit(workspace, old or "HEAD"), resolve_commit(workspace, new or "HEAD")
                commits = commit_range(workspace, a, b)[0] if a and b else []
                if commits:
                    fx.reverted.update(commits)
                else:
                    fx.unknown.append(word)
            elif (commit := resolve_commit(workspace, word)) is not None:
                fx.reverted.add(commit)
            else:
                fx.unknown.append(f"{word} (no commit of the workspace's repository)")
    elif sub == "reset" and any(a in ("--hard", "--keep", "--merge") for a in rest):
        source = resolve_commit(workspace, words[0]) if words else resolve_commit(workspace, "HEAD")
        if source is None:
            fx.unknown.append(f"{' '.join(words)} (no commit of the workspace's repository)")
        else:
            fx.restored.append((source, None))
    elif sub == "stash" and (not words or words[0] in ("push", "save")):
        fx.restored.append((resolve_commit(workspace, "HEAD"), paths))
    elif sub in ("checkout", "restore", "switch"):
        source: str | None = None
        for i, a in enumerate(rest):
            if a.startswith("--source="):
                source = a.partition("=")[2]
            elif a in ("-s", "--source") and i + 1 < len(rest):
                source = rest[i + 1]
                words = [w for w in words if w != source]
        if sub == "checkout" and paths is not None and words:
            source = words[0]
        if sub == "checkout" and paths is None and words:
            # `git checkout X`: a revision (the whole tree) or, where none resolves, paths
            if len(words) == 1 and (commit := resolve_commit(workspace, words[0])) is not None:
                fx.restored.append((commit, None))
                return
            paths = words
        elif sub == "restore" and paths is None:
            paths = words
        commit = resolve_commit(workspace, source or "HEAD")
        if commit is None:
            fx.unknown.append(f"{source} (no commit of the workspace's repository)")
            return
        rels = [r for p in paths or [] if (r := _relative(workspace, p)) is not None]
        fx.restored.append((commit, None if "." in rels else rels))
    elif sub == "apply" and any(a in ("-R", "--reverse") for a in rest):
        for word in words:
            fx.patched |= _patch_paths(workspace, word)


def _effects(workspace: Path, rollback: str) -> _Effects:
    fx = _Effects()
    for command in _commands(rollback):
        fx.mentioned += command
        while command and (m := _ASSIGN.fullmatch(command[0])):
            fx.assigned[m.group(1)] = m.group(2)
            command = command[1:]
        if not command:
            continue
        name, args = Path(command[0]).name, command[1:]
        if name == "export":
            fx.assigned.update(
                {m.group(1): m.group(2) for a in args if (m := _ASSIGN.fullmatch(a)) is not None}
            )
        elif name == "unset":
            fx.unset.update(a for a in args if not a.startswith("-"))
        elif name == "env":
            fx.unset.update(b for a, b in pairwise(args) if a in ("-u", "--unset"))
            fx.assigned.update(
                {m.group(1): m.group(2) for a in args if (m := _ASSIGN.fullmatch(a)) is not None}
            )
        elif name == "git":
            _git_effects(workspace, args, fx)
        elif name == "patch" and any(a in ("-R", "--reverse") for a in args):
            files = [b for a, b in pairwise(args) if a in ("<", "-i", "--input")]
            for file in files:
                fx.patched |= _patch_paths(workspace, file)
        elif name in ("cp", "mv") and len(words := [a for a in args if not a.startswith("-")]) == 2:
            src, dst = (_relative(workspace, w) for w in words)
            if src and dst and (workspace.resolve() / src).is_file():
                try:
                    data = (workspace.resolve() / src).read_bytes()
                except OSError:
                    continue
                fx.copied[dst] = hashlib.sha256(data).hexdigest()
    return fx


def _option_restored(name: str, value: str | None, tokens: list[str]) -> bool:
    from perfgate.benchmarking.workload.argv import argv_options

    spelled = [t for t in tokens if t.startswith("-") and t.lstrip("-").replace("-", "_").lower() == name]
    if value is None:  # added by the candidate: naming it is all a rollback can say ("drop --compile")
        return bool(spelled) or any(
            t.partition("=")[0].lstrip("-").replace("-", "_").lower() == name
            for t in tokens
            if t.startswith("-")
        )
    return argv_options(tokens).get(name) == value or (value == "true" and bool(spelled))


def _file_restored(workspace: Path, change: CandidateChange, path: str, fx: _Effects) -> bool:
    """The rollback brings ``path`` back to the version the baseline ran: a reverse patch touching it, a
    copy of the baseline's bytes, or a restore from a commit whose blob is the baseline's."""
    if path in fx.patched or (path in change.sha256 and fx.copied.get(path) == change.sha256[path]):
        return True
    home = change.home.get(path)
    if home is None:  # the baseline ran it uncommitted: no commit holds its version
        return False
    want = object_id(workspace, home, path)
    for source, paths in fx.restored:
        covered = paths is None or any(
            p == "." or path == p or path.startswith(p.rstrip("/") + "/") for p in paths
        )
        if covered and source is not None and object_id(workspace, source, path) == want:
            return True
    return False


def _suggestion(change: CandidateChange, files: list[str], revert: bool) -> list[str]:
    """Rollback commands that would undo ``files`` (and the commit range, when ``revert``)."""
    out: list[str] = []
    if revert and change.commits:
        first, last = change.commits[-1][:12], change.commits[0][:12]
        out.append(
            f"git revert --no-edit {first}" if first == last else f"git revert --no-edit {first}^..{last}"
        )
        files = [p for p in files if p in change.dirty]
    restorable = [p for p in files if change.home.get(p) is not None]
    if restorable:
        out.append(
            f"git checkout {change.base_commit[:12]} -- {' '.join(shlex.quote(p) for p in restorable[:8])}"
        )
    out += [f"git apply -R <a patch of {p}>" for p in files if change.home.get(p) is None][:3]
    return out


def _judge(workspace: Path, change: CandidateChange, rollback: str) -> Check:
    fx = _effects(workspace, rollback)
    undone: list[str] = []
    missing: list[str] = []
    fixes: list[str] = []
    reverted = bool(change.commits) and set(change.commits) <= fx.reverted
    if reverted:
        undone.append("reverts " + ", ".join(c[:10] for c in change.commits[:4]))
    left: list[str] = []
    for path in sorted(change.home):
        by_revert = reverted and path in change.committed and path not in change.dirty
        if by_revert:
            continue
        if _file_restored(workspace, change, path, fx):
            undone.append(f"restores {path}")
        else:
            left.append(path)
    if change.unlisted and not reverted and not any(paths is None for _, paths in fx.restored):
        left.append("the commits between the sides")
    if left:
        missing.append("the code change in " + ", ".join(left[:8]))
        fixes += _suggestion(change, left, revert=not reverted)
    for name, value in change.env.items():
        if value is None and name in fx.unset:
            undone.append(f"unsets {name}")
        elif value is not None and (
            fx.assigned.get(name) == value or (value.startswith("<redacted") and name in fx.assigned)
        ):
            undone.append(f"sets {name} back")
        else:
            missing.append(f"environment variable {name}")
            fixes.append(f"unset {name}" if value is None else f"{name}={shlex.quote(value)}")
    for name, value in change.options.items():
        if _option_restored(name, value, fx.mentioned):
            undone.append(f"--{name} back to the baseline's")
        else:
            missing.append(f"option --{name}")
            fixes.append(f"drop --{name}" if value is None else f"--{name} {shlex.quote(value)}")
    if not missing:
        return Check(
            True, True, "the rollback undoes the candidate's change: it " + "; ".join(undone[:6]), []
        )
    stray = sorted(c[:10] for c in fx.reverted - set(change.commits))
    notes = [f"it reverts {', '.join(stray[:3])}, which is not the candidate's commit"] if stray else []
    notes += [f"it names {u}" for u in fx.unknown[:2]]
    if change.unlisted:
        notes.append(change.unlisted)
    return Check(
        True,
        False,
        f"rollback {rollback[:120]!r} does not undo the candidate's change: it leaves "
        + "; ".join(missing[:6])
        + (f" ({'; '.join(notes)})" if notes else ""),
        [],
        "decide keep again with a rollback that undoes the change, e.g. rollback="
        + repr("; ".join(dict.fromkeys(fixes))[:400]),
    )


def _names_something(rollback: str, workspace: Path, baseline: Sequence[EvidenceRecord]) -> Check:
    """Where the difference is not recorded: the rollback names a commit, a workspace file or a setting
    the baseline ran with, each checked against the repository, the workspace or the ledger."""
    found: list[str] = []
    unknown: list[str] = []
    for token in (t for c in _commands(rollback) for t in c):
        if token in ("-", "--"):
            continue
        if token.startswith("-") or _ASSIGN.fullmatch(token):
            if _baseline_ran(token, baseline):
                found.append(f"{token} (the baseline's windows ran with it)")
            elif baseline:
                unknown.append(f"{token} is not in the baseline windows' recorded command or environment")
        elif ("/" in token or "." in token) and (rel := _relative(workspace, token)) not in (None, "."):
            if (workspace.resolve() / rel).is_file():
                found.append(f"file {token}")
        elif (_HEX.fullmatch(token) or token in ("HEAD", "@") or "~" in token or "^" in token) and token:
            if (commit := resolve_commit(workspace, token)) is not None:
                found.append(f"commit {token} ({commit[:10]})")
            elif _HEX.fullmatch(token):
                unknown.append(f"{token} is no commit of the workspace's repository")
    if found:
        return Check(True, True, "the rollback names " + "; ".join(found[:3]), [])
    why = "; ".join(unknown[:3]) or "it names no commit, workspace file or baseline setting"
    options = (
        [a for a in str_list(baseline[0].inputs.get("command")) if a.startswith("-")][:3] if baseline else []
    )
    return Check(
        True,
        False,
        f"rollback {rollback[:120]!r} cannot be checked: {why}",
        [],
        "decide keep again with a rollback that names what restores the baseline and can be checked: a commit "
        "of this repository (rollback='git revert <sha>'), a workspace file (rollback='git checkout HEAD -- "
        "<path>' or 'git apply -R <patch file>')"
        + (
            f", or the baseline's own options as its windows ran them (e.g. {' '.join(options)!r})"
            if options
            else ""
        ),
    )


def _baseline_ran(token: str, baseline: Sequence[EvidenceRecord]) -> bool:
    """The option or assignment is one the baseline windows' recorded command or environment holds."""
    for record in baseline:
        argv = str_list(record.inputs.get("command"))
        env = {str(k): str(v) for k, v in as_dict(record.inputs.get("env")).items()}
        if token.startswith("-"):
            name, eq, value = token.partition("=")
            if token in argv or (eq and any(a == name and b == value for a, b in pairwise(argv))):
                return True
        elif (m := _ASSIGN.fullmatch(token)) is not None and (
            env.get(m.group(1)) == m.group(2) or token in argv
        ):
            return True
    return False


def rollback_check(
    rollback: str,
    workspace: Path,
    baseline: Sequence[EvidenceRecord],
    candidate: Sequence[EvidenceRecord],
) -> Check:
    """Whether ``rollback`` undoes what the candidate's windows changed against the baseline's (the
    first of each side, as the comparison's differences read them)."""
    change: Any = None
    if baseline and candidate:
        change = candidate_change(workspace, baseline[0], candidate[0])
    if change is None or change.empty():
        return _names_something(rollback, workspace, baseline)
    return _judge(workspace, change, rollback)
