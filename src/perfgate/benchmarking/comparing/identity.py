"""A candidate's identity: what ran that matters, read from its window evidence.

What ran is the command line less the values of options the run itself wrote (`benchmarking.workload.outputs`: a
dump, checkpoint or log path, observed written), the environment variables set for it, its contract's
execution settings, and the code state: the commit, each path of the uncommitted diff and each file the
command names, less the paths the run wrote. Not how many launches a call made (sample size), not its label,
not the outputs a run leaves in the workspace for the next call to find. Windows with one identity are
one candidate, whichever call measured them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from perfgate.benchmarking.comparing.sides import IMPORT_TOOL, record_contract, record_provenance
from perfgate.benchmarking.workload.argv import argv_changes, launched_argv
from perfgate.benchmarking.workload.outputs import mask_outputs, output_options, output_paths, under
from perfgate.evidence.access import as_dict

if TYPE_CHECKING:
    from perfgate.evidence import EvidenceRecord

__all__ = ["identity_differences", "identity_key", "ran_argv", "record_identity", "written_by"]


def written_by(path: str, written: Sequence[str]) -> bool:
    """``path`` (workspace-relative) is, or lies under, a path the run wrote."""
    return any(under(path, w) for w in written)


def ran_argv(record: EvidenceRecord) -> list[str] | None:
    """The command as launched (`argv.launched_argv`), each value the run wrote read as an output; None
    when the record holds no command line (imported evidence)."""
    argv = launched_argv(record.inputs)
    if not isinstance(argv, list):
        return None
    return mask_outputs([str(x) for x in cast("list[Any]", argv)], output_options(record.result))


def record_identity(record: EvidenceRecord) -> dict[str, Any]:
    """What ran, field by field (see the module's docstring).

    Raises:
        BenchmarkError: the stored contract names one entry twice.
    """
    execution = record_contract(record).execution
    if record.tool == IMPORT_TOOL:
        return {"execution": execution}
    written = output_paths(record.result)
    prov = record_provenance(record)
    code = as_dict(prov.get("code"))
    diff_files = code.get("diff_files")
    return {
        "argv": ran_argv(record),
        "env": as_dict(record.inputs.get("env")),
        "execution": execution,
        "commit": code.get("commit"),
        # an older record names no paths of its diff: its whole digest stands for the code
        "code": {p: d for p, d in as_dict(diff_files).items() if not written_by(p, written)}
        if isinstance(diff_files, Mapping)
        else code.get("diff_sha256"),
        "files": {p: d for p, d in as_dict(prov.get("files")).items() if not written_by(p, written)},
    }


def identity_key(record: EvidenceRecord) -> str:
    """`record_identity` as one string: windows of one candidate share it."""
    return json.dumps(record_identity(record), sort_keys=True, default=str)


def identity_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """What differs between two identities, by name: 'argv --lr', 'argv positional arguments', 'env.NAME',
    'execution.KEY', 'code commit', 'code PATH', 'file PATH'."""
    out: list[str] = []
    a_argv, b_argv = a.get("argv"), b.get("argv")
    if isinstance(a_argv, list) and isinstance(b_argv, list):
        out += [f"argv {o}" for o in argv_changes(cast("list[str]", a_argv), cast("list[str]", b_argv))]
    elif a_argv != b_argv:
        out.append("argv")
    for name, prefix, sep in (("env", "env", "."), ("execution", "execution", "."), ("files", "file", " ")):
        x, y = as_dict(a.get(name)), as_dict(b.get(name))
        out += [f"{prefix}{sep}{k}" for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)]
    if a.get("commit") != b.get("commit"):
        out.append("code commit")
    a_code, b_code = a.get("code"), b.get("code")
    if isinstance(a_code, Mapping) and isinstance(b_code, Mapping):
        x, y = cast("Mapping[str, Any]", a_code), cast("Mapping[str, Any]", b_code)
        out += [f"code {p}" for p in sorted(set(x) | set(y)) if x.get(p) != y.get(p)]
    elif a_code != b_code:
        out.append("code")
    return out
