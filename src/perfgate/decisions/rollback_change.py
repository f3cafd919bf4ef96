"""What a candidate changed, as its recorded runs show it: the commits between the baseline's code state and
the candidate's, the files their diffs touched, and the environment variables and command-line options
that differ. `perfgate.decisions.rollback` judges a keep's rollback against it.

Git is only read here (``rev-parse``, ``rev-list``, ``diff-tree``), never written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from perfgate.evidence import EvidenceRecord
from perfgate.evidence.access import as_dict

__all__ = [
    "MAX_COMMITS",
    "REF",
    "CandidateChange",
    "candidate_change",
    "commit_range",
    "git_text",
    "object_id",
    "resolve_commit",
]

MAX_COMMITS = 64
"""Commits of a candidate's range that are listed; a longer range is undone by a reset or by files."""
REF = re.compile(r"@|[A-Za-z0-9_][A-Za-z0-9_./~^+-]{0,199}")
"""What a rollback may name as a git revision (no leading '-', no path syntax, no spaces)."""


@dataclass
class CandidateChange:
    """What the candidate's runs differ in from the baseline's, as recorded. ``commits``: the candidate's
    range (baseline's commit excluded); ``committed``: files changed between the two commits; ``dirty``:
    files whose uncommitted diff differs; ``home``: path -> the commit that holds the baseline's version
    (None when the baseline ran it uncommitted); ``sha256``: the baseline's digest of a file its command
    names; ``env``/``options``: name -> the baseline's value (None: the baseline did not set it)."""

    base_commit: str
    commits: list[str] = field(default_factory=list[str])
    unlisted: str | None = None
    committed: set[str] = field(default_factory=set[str])
    dirty: set[str] = field(default_factory=set[str])
    home: dict[str, str | None] = field(default_factory=dict[str, "str | None"])
    sha256: dict[str, str] = field(default_factory=dict[str, str])
    env: dict[str, str | None] = field(default_factory=dict[str, "str | None"])
    options: dict[str, str | None] = field(default_factory=dict[str, "str | None"])

    def empty(self) -> bool:
        return not (self.commits or self.unlisted or self.home or self.env or self.options)


def git_text(workspace: Path, args: list[str]) -> str | None:
    from perfgate.execution.changes import git_output

    out = git_output(workspace, args)
    return None if out is None else out.decode(errors="replace").strip()


def resolve_commit(workspace: Path, ref: str) -> str | None:
    """The full commit id ``ref`` names in the workspace's repository, read only; None if none."""
    if not REF.fullmatch(ref) or ".." in ref:
        return None
    return git_text(workspace, ["rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}"])


def object_id(workspace: Path, commit: str, path: str) -> str | None:
    """The object id of ``path`` (workspace-relative) at ``commit``; None when absent there."""
    return git_text(workspace, ["rev-parse", "--verify", "--quiet", "--end-of-options", f"{commit}:./{path}"])


def commit_range(workspace: Path, old: str, new: str) -> tuple[list[str], str | None]:
    listed = git_text(workspace, ["rev-list", f"--max-count={MAX_COMMITS + 1}", f"{old}..{new}"])
    if listed is None:
        return [], f"the commits {old[:10]}..{new[:10]} cannot be listed"
    commits = listed.split()
    if len(commits) > MAX_COMMITS:
        return [], f"more than {MAX_COMMITS} commits lie between {old[:10]} and {new[:10]}"
    return commits, None


def candidate_change(workspace: Path, base: EvidenceRecord, cand: EvidenceRecord) -> CandidateChange | None:
    """The recorded difference between a baseline and a candidate window, less what the runs themselves
    wrote (`perfgate.benchmarking.comparing.identity`: an output path is no setting to restore); None when a side
    has no recorded code state (its difference cannot be known)."""
    from perfgate.benchmarking.comparing.identity import ran_argv, written_by
    from perfgate.benchmarking.comparing.sides import record_provenance
    from perfgate.benchmarking.workload.argv import argv_options
    from perfgate.benchmarking.workload.outputs import output_paths

    b_prov, c_prov = record_provenance(base), record_provenance(cand)
    b_code, c_code = as_dict(b_prov.get("code")), as_dict(c_prov.get("code"))
    b_commit, c_commit = b_code.get("commit"), c_code.get("commit")
    if not isinstance(b_commit, str) or not isinstance(c_commit, str):
        return None
    change = CandidateChange(base_commit=b_commit)
    b_diff, c_diff = as_dict(b_code.get("diff_files")), as_dict(c_code.get("diff_files"))
    if b_commit != c_commit:
        change.commits, change.unlisted = commit_range(workspace, b_commit, c_commit)
        names = git_text(
            workspace,
            ["diff-tree", "-r", "-z", "--name-only", "--relative", "--no-renames", b_commit, c_commit],
        )
        if names is None:
            change.unlisted = (
                change.unlisted or f"the files changed in {b_commit[:10]}..{c_commit[:10]} cannot be listed"
            )
        change.committed = {n for n in (names or "").split("\0") if n}
    change.dirty = {p for p in c_diff if b_diff.get(p) != c_diff.get(p)}
    b_files, c_files = as_dict(b_prov.get("files")), as_dict(c_prov.get("files"))
    change.sha256 = {
        str(p): d for p, d in b_files.items() if isinstance(d, str) and p in c_files and c_files[p] != d
    }
    written = [*output_paths(base.result), *output_paths(cand.result)]
    for path in sorted(change.committed | change.dirty | set(change.sha256)):
        if not written_by(path, written):
            change.home[path] = None if path in b_diff else b_commit
    b_env = {str(k): str(v) for k, v in as_dict(base.inputs.get("env")).items()}
    c_env = {str(k): str(v) for k, v in as_dict(cand.inputs.get("env")).items()}
    change.env = {n: b_env.get(n) for n in sorted(set(b_env) | set(c_env)) if b_env.get(n) != c_env.get(n)}
    b_argv, c_argv = ran_argv(base), ran_argv(cand)
    if b_argv is not None and c_argv is not None:
        b_opts, c_opts = argv_options(b_argv), argv_options(c_argv)
        change.options = {
            n: b_opts.get(n) for n in sorted(set(b_opts) | set(c_opts)) if b_opts.get(n) != c_opts.get(n)
        }
    return change
