"""A parity check below the tool: the compare-and-digest session, its verdict, producers, dtype ceilings."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import anyio
import blake3
import numpy as np
import pytest

from perfgate.decisions.equivalence import REORDER_ALLOWANCE, tolerance_by_dtype
from perfgate.harness.dump import dump_tensors
from perfgate.tensors import CompareOptions, ComparisonReport, TensorComparison, TensorInputError
from perfgate.tensors.producers import FileDigests, digest_algorithms, find_producers
from perfgate.tensors.session import compare_files, worst_mismatches
from perfgate.tensors.verdict import check_notes, problems_first, summary


def _tensor(key: str, status: Any = "match", **changes: Any) -> TensorComparison:
    base = TensorComparison(
        key=key,
        status=status,
        shape_reference=[4],
        shape_candidate=[4],
        dtype_reference="float32",
        dtype_candidate="float32",
        compared_as="tolerance",
        atol=1e-5,
        rtol=1e-6,
        elements=4,
        mismatched=0,
        mismatched_fraction=0.0,
        max_abs_error=0.0,
        max_abs_error_index=None,
        max_rel_error=0.0,
        max_abs_error_mismatched=None,
        max_rel_error_mismatched=None,
        mean_abs_error=0.0,
        cosine=1.0,
        nonfinite_reference=0,
        nonfinite_candidate=0,
        reference_key=key,
        candidate_key=key,
    )
    return replace(base, **changes)


def _report(tensors: list[TensorComparison], **changes: Any) -> ComparisonReport:
    base = ComparisonReport(
        status="match",
        tensors=tensors,
        missing_keys=[],
        extra_keys=[],
        summary="4 tensors agree",
        elements_compared=16,
        bytes_read=64,
    )
    return replace(base, **changes)


# ----------------------------------------------------------------------------- verdict


def test_problems_are_listed_value_mismatches_first_and_the_worst_fraction_first() -> None:
    tensors = [
        _tensor("ok"),
        _tensor("dtype", "dtype_mismatch"),
        _tensor("slightly", "value_mismatch", mismatched_fraction=0.1),
        _tensor("shape", "shape_mismatch", mismatched_fraction=None),
        _tensor("badly", "value_mismatch", mismatched_fraction=0.9),
    ]
    assert [tensors[i].key for i in problems_first(tensors)] == ["badly", "slightly", "shape", "dtype", "ok"]


def test_the_summary_counts_renamed_keys_only_when_some_were_renamed() -> None:
    from perfgate.tensors import MappedKey

    assert summary(_report([])) == "4 tensors agree"
    mapped = [MappedKey("w", "_orig_mod.w", "w"), MappedKey("b", "_orig_mod.b", "b")]
    assert summary(_report([], mapped_keys=mapped)) == "4 tensors agree; 2 keys renamed by key_map"


def test_notes_name_unbound_files_the_nonfinite_opt_in_and_dtypes_beyond_the_ceiling_in_that_order() -> None:
    report = _report([], notes=["from the comparison"])
    assert check_notes(report, unbound=[], allow_nonfinite=False, beyond_ceiling=[]) == [
        "from the comparison"
    ]
    notes = check_notes(
        report, unbound=["candidate c.npy"], allow_nonfinite=True, beyond_ceiling=["bfloat16", "float32"]
    )
    assert notes[0] == "from the comparison"
    assert notes[1].startswith("unbound (no perfgate-launched run dumped these bytes): candidate c.npy;")
    assert notes[2].startswith("allow_nonfinite:")
    assert notes[3].startswith("bfloat16, float32 compared beyond the equivalence ceiling")
    assert report.notes == ["from the comparison"], "the report's own notes are not changed"


# ----------------------------------------------------------------------------- dtype ceilings


def test_tolerance_by_dtype_takes_the_loosest_tolerance_per_reference_dtype_and_judges_it() -> None:
    rows = tolerance_by_dtype(
        [
            _tensor("a", atol=1e-5, rtol=1e-6),
            _tensor("b", atol=2e-5, rtol=1e-7),
            _tensor("ids", compared_as="exact", dtype_reference="int64", atol=0.0, rtol=0.0),
            _tensor("h", dtype_reference="bfloat16", atol=1.0, rtol=0.5),
            _tensor("f8", dtype_reference="float8_e4m3fn", atol=0.0, rtol=0.0),
            _tensor("f8b", dtype_reference="float8_e5m2", atol=1e-3, rtol=0.0),
        ]
    )
    by = {r.dtype: r for r in rows}
    assert [r.dtype for r in rows] == sorted(by), "sorted by dtype name; exact comparisons left out"
    assert (by["float32"].tensors, by["float32"].atol, by["float32"].rtol) == (2, 2e-5, 1e-6)
    assert by["float32"].within_ceiling
    assert by["float32"].equivalence_atol == pytest.approx(1e-5 * REORDER_ALLOWANCE)
    assert not by["bfloat16"].within_ceiling
    assert by["float8_e4m3fn"].within_ceiling, "bit-exact is within even without a shipped ceiling"
    assert not by["float8_e5m2"].within_ceiling and by["float8_e5m2"].equivalence_atol is None


# ----------------------------------------------------------------------------- producers


@dataclass
class _State:
    value: str


@dataclass
class _Record:
    id: str
    result: dict[str, Any]
    state: _State = field(default_factory=lambda: _State("executed"))


@dataclass
class _Ledger:
    rows: list[_Record]

    def records(self, tool: str | None = None) -> list[_Record]:
        return self.rows if tool == "run_benchmark_window" else []


HEX_A, HEX_B = "a" * 64, "b" * 64


def test_a_file_binds_to_the_newest_run_that_dumped_the_same_bytes_at_the_same_path() -> None:
    code = {"git_commit": "abc"}
    ledger: Any = _Ledger(
        [
            _Record("ev-old", {"tensor_dumps": [{"path": "r.safetensors", "digest": f"blake3:{HEX_A}"}]}),
            _Record(
                "ev-new",
                {
                    "tensor_dumps": [{"path": "r.safetensors", "digest": f"blake3:{HEX_A}", "launch": 1}],
                    "provenance": {"code": code},
                },
            ),
            _Record(
                "ev-failed",
                {"tensor_dumps": [{"path": "c.safetensors", "digest": f"blake3:{HEX_B}"}]},
                _State("failed"),
            ),
        ]
    )
    files = [
        FileDigests("reference", "r.safetensors", f"blake3:{HEX_A}"),
        FileDigests("candidate", "c.safetensors", f"blake3:{HEX_B}"),
    ]
    ref, cand = find_producers(ledger, files)
    assert (ref.evidence_id, ref.launch, ref.code, ref.digest) == ("ev-new", 1, code, f"blake3:{HEX_A}")
    assert cand.evidence_id is None and cand.launch is None, "a run that did not execute binds nothing"
    assert cand.digest == f"blake3:{HEX_B}"


def test_an_older_algorithm_is_taken_only_when_a_record_names_a_dump_at_that_path() -> None:
    ledger: Any = _Ledger(
        [
            _Record(
                "ev-1",
                {"tensor_dumps": [{"path": "r.npy", "sha256": HEX_B}, {"path": "x.npy", "digest": "md5:0"}]},
            )
        ]
    )
    assert digest_algorithms(ledger, {"c.npy"}) == ["blake3"]
    assert digest_algorithms(ledger, {"r.npy", "x.npy"}) == ["blake3", "sha256"]
    (found,) = find_producers(
        ledger, [FileDigests("reference", "r.npy", f"blake3:{HEX_A}", (f"sha256:{HEX_B}",))]
    )
    assert (found.evidence_id, found.digest) == ("ev-1", f"sha256:{HEX_B}")
    (other,) = find_producers(
        ledger, [FileDigests("reference", "r.npy", f"blake3:{HEX_A}", (f"sha256:{HEX_A}",))]
    )
    assert other.evidence_id is None and other.digest == f"blake3:{HEX_A}"


# ----------------------------------------------------------------------------- session


async def _no_progress(done: float, total: float, message: str) -> None:
    pass


def _same(path: Path) -> Path:
    return path


def test_a_session_compares_digests_every_file_read_and_histograms_the_worst_mismatch(tmp_path: Path) -> None:
    ref = dump_tensors(
        tmp_path / "r.safetensors", {"w": np.zeros(4096, np.float32), "b": np.ones(8, np.float32)}
    )
    values = np.zeros(4096, np.float32)
    values[:10] = 1.0
    cand = dump_tensors(tmp_path / "c.safetensors", {"w": values, "b": np.ones(8, np.float32)})
    asked: list[tuple[Path, ...]] = []

    def algorithms(paths: tuple[Path, ...]) -> list[Any]:
        asked.append(paths)
        return ["blake3", "sha256"]

    async def check() -> Any:
        return await compare_files(
            ref,
            cand,
            CompareOptions(atol=0.0, rtol=0.0),
            confine=_same,
            algorithms=algorithms,
            progress=_no_progress,
        )

    run = anyio.run(check)
    assert asked == [(ref, cand)]
    assert run.report.status == "mismatch"
    assert [t.key for t in worst_mismatches(run.report)] == ["w"]
    assert [(f.role, f.path) for f in run.files] == [("reference", ref), ("candidate", cand)]
    for f in run.files:
        data = f.path.read_bytes()
        assert f.size_bytes == len(data)
        assert f.digests == {
            "blake3": blake3.blake3(data).hexdigest(),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
    edges, counts = run.histograms["w"]
    assert len(edges) == len(counts) + 1 and sum(counts) == 10
    assert set(run.histograms) == {"w"}


def test_a_session_names_the_side_it_could_not_open(tmp_path: Path) -> None:
    ref = dump_tensors(tmp_path / "r.safetensors", {"w": np.zeros(4, np.float32)})
    (tmp_path / "c.safetensors").write_bytes(b"not tensors")

    async def check() -> Any:
        return await compare_files(
            ref,
            tmp_path / "c.safetensors",
            CompareOptions(atol=0.0, rtol=0.0),
            confine=_same,
            algorithms=lambda paths: ["blake3"],
            progress=_no_progress,
        )

    with pytest.raises(TensorInputError, match=r"^candidate: "):
        anyio.run(check)
