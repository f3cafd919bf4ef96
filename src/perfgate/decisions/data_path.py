"""Whether a comparison's sides took different data paths: then the change touches data, declared or not.

Two facts the evidence records, never the experiment's ``touches_data`` flag alone: the inputs that reached
the model (each launch's sample stream digest, taken by the harness over the first training forwards of
the warm-up), and the code that differs between the sides (a changed file whose path names data loading, or
a changed line of the runs' recorded diffs about data loading or preprocessing).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from perfgate.evidence import EvidenceRecord
from perfgate.evidence.access import as_dict, as_list, str_list

__all__ = ["data_path_changes"]

Lookup = Callable[[str], EvidenceRecord | None]

_DATA_PATH = re.compile(r"(?i)(data|loader|sampler|collate|augment|transform|tokeni[sz])")
"""A path component naming data loading, sampling or preprocessing (train_data.py, datasets/, loader.py)."""
_DATA_CODE = re.compile(
    r"\b(DataLoader|Dataset|IterableDataset|Sampler|collate_fn|__getitem__|__iter__|num_workers|shuffle|"
    r"drop_last|set_epoch|random_split|transforms?\.|Normalize|normali[sz]e)"
)
"""Data loading, sampling and preprocessing in a changed line of a diff."""
_SECTION = re.compile(r"^diff --git a/.*? b/(.*?)$", re.MULTILINE)


def _stream(ids: list[str], lookup: Lookup) -> str | None:
    """The side's sample stream when every launch read one and they all agree; else None (unknown, or a
    stream that is not reproducible from launch to launch, which cannot tell the sides apart)."""
    streams: list[object] = []
    for wid in ids:
        record = lookup(wid)
        launches = as_list(record.result.get("sample_streams")) if record else []
        if not launches:
            return None
        streams.extend(launches)
    distinct = set(map(str, streams))
    if any(s is None for s in streams) or len(distinct) != 1:
        return None
    return distinct.pop()


def _changed_paths(comparison: EvidenceRecord, lookup: Lookup) -> list[str]:
    from perfgate.benchmarking.workload.provenance import code_differences

    paths = [
        str(d.get("field"))[len("file:") :]
        for d in map(as_dict, as_list(comparison.result.get("differences")))
        if d.get("kind") == "file"
    ]
    first = [
        lookup(ids[0]) if ids else None
        for ids in (str_list(comparison.inputs.get("baseline")), str_list(comparison.inputs.get("candidate")))
    ]
    if first[0] is not None and first[1] is not None:
        codes = [as_dict(as_dict(r.result.get("provenance")).get("code")) for r in first if r is not None]
        paths += [p for p in code_differences(codes[0], codes[1]) if p != "commit"]
    return sorted(set(paths))


def _changed_lines(record: EvidenceRecord, workspace: Path) -> dict[str, set[str]]:
    """Per path, the added and removed lines of the run's dirty diff (its code.diff artifact, checked)."""
    from perfgate.evidence.artifacts import ArtifactChanged, read_artifact

    artifact = next((a for a in record.artifacts if a.name == "code.diff"), None)
    if artifact is None:
        return {}
    try:
        text = read_artifact(workspace, artifact).decode("utf-8", "replace")
    except ArtifactChanged:
        return {}
    starts = [(m.start(), m.group(1)) for m in _SECTION.finditer(text)]
    out: dict[str, set[str]] = {}
    for i, (start, path) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(text)
        out[path] = {
            line
            for line in text[start:end].splitlines()
            if line[:1] in "+-" and not line.startswith(("+++", "---"))
        }
    return out


def _data_code_edits(comparison: EvidenceRecord, lookup: Lookup, workspace: Path) -> list[str]:
    """Paths whose diff differs between the sides in a line about data loading or preprocessing."""
    ids = [str_list(comparison.inputs.get(side)) for side in ("baseline", "candidate")]
    records = [lookup(side[0]) if side else None for side in ids]
    if records[0] is None or records[1] is None:
        return []
    base, cand = _changed_lines(records[0], workspace), _changed_lines(records[1], workspace)
    return sorted(
        path
        for path in set(base) | set(cand)
        if any(_DATA_CODE.search(line) for line in base.get(path, set()) ^ cand.get(path, set()))
    )


def data_path_changes(comparison: EvidenceRecord, lookup: Lookup, workspace: Path) -> list[str]:
    """Why the comparison's sides took different data paths (empty: no sign that they did)."""
    reasons: list[str] = []
    base = _stream(str_list(comparison.inputs.get("baseline")), lookup)
    cand = _stream(str_list(comparison.inputs.get("candidate")), lookup)
    if base is not None and cand is not None and base != cand:
        reasons.append(
            f"the inputs reaching the model differ between the sides (sample stream {base[:12]} vs {cand[:12]}, "
            "each the same over its side's launches)"
        )
    data_files = [p for p in _changed_paths(comparison, lookup) if _DATA_PATH.search(p)]
    if data_files:
        reasons.append(f"the code diff touches data-loading code ({', '.join(data_files[:5])})")
    edited = [p for p in _data_code_edits(comparison, lookup, workspace) if p not in data_files]
    if edited:
        reasons.append(f"the code diff edits data loading or preprocessing in {', '.join(edited[:5])}")
    return reasons
