"""Contract cross-checks and A/B contract differences."""

from __future__ import annotations

import pytest

from perfgate.benchmarking import Contract, ContractError, check_contract, diff_contracts
from perfgate.benchmarking.workload.contract import check_observed, data_parallel_size, same_contract


def _c(inv: dict[str, object] | None = None, exe: dict[str, object] | None = None) -> Contract:
    return Contract(dict(inv or {}), dict(exe or {}))


def test_a_consistent_global_batch_passes() -> None:
    c = _c(
        {"global_batch": 256, "model": "gpt-small"}, {"microbatch": 16, "accumulation": 4, "world_size": 4}
    )
    assert check_contract(c) == []


def test_a_global_batch_that_does_not_add_up_is_reported_with_the_product() -> None:
    c = _c({"global_batch": 256}, {"microbatch": 16, "accumulation": 2, "world_size": 4})
    (problem,) = check_contract(c)
    assert "256" in problem and "= 128" in problem


def test_model_parallel_degrees_divide_the_world_into_data_parallel_ranks() -> None:
    assert data_parallel_size({"world_size": 16, "tensor_parallel": 2, "pipeline_parallel": 2}) == 4
    assert data_parallel_size({"world_size": 16, "data_parallel": 8}) == 8
    with pytest.raises(ContractError, match="not divisible"):
        data_parallel_size({"world_size": 6, "tensor_parallel": 4})


def test_a_partial_batch_declaration_names_what_is_missing() -> None:
    (problem,) = check_contract(_c({}, {"microbatch": 8}))
    assert "invariants.global_batch" in problem


def test_a_single_process_needs_no_data_parallel_key() -> None:
    """Issue 48 item 7: the data-parallel size is 1 unless declared (a run with more ranks measures a larger
    batch than its global_batch, and that is refused when observed)."""
    assert check_contract(_c({"global_batch": 64}, {"microbatch": 8, "accumulation": 8})) == []
    (problem,) = check_contract(_c({"global_batch": 64}, {"microbatch": 8}))
    assert "global_batch 64 != microbatch 8 x accumulation 1 x data_parallel 1 = 8" in problem


def test_non_integer_sizes_are_refused() -> None:
    with pytest.raises(ContractError, match="positive integer"):
        check_contract(_c({"global_batch": "64"}, {"microbatch": 8, "world_size": 8}))


def test_no_batch_keys_means_nothing_to_cross_check() -> None:
    assert check_contract(_c({"model": "m"}, {"compile": True})) == []


def test_a_key_cannot_be_both_invariant_and_execution_setting() -> None:
    assert "both as invariant" in check_contract(_c({"compile": False}, {"compile": True}))[0]


def test_declared_changes_match_actual_changes() -> None:
    base = _c({"model": "m", "global_batch": 64}, {"microbatch": 16, "accumulation": 4, "compile": False})
    cand = _c({"model": "m", "global_batch": 64}, {"microbatch": 32, "accumulation": 2, "compile": False})
    diff = diff_contracts(base, cand, ["microbatch", "accumulation"])
    assert diff.comparable
    assert diff.actual_changes == ["accumulation", "microbatch"]


def test_changed_invariants_undeclared_and_absent_changes_are_all_reasons() -> None:
    base = _c({"model": "m", "precision": "bf16"}, {"workers": 2, "compile": False})
    cand = _c({"model": "m", "precision": "fp8"}, {"workers": 8, "compile": False})
    diff = diff_contracts(base, cand, ["compile"])
    assert not diff.comparable
    assert diff.changed_invariants == ["precision"]
    assert diff.undeclared_changes == ["workers"]
    assert diff.declared_but_absent == ["compile"]
    reasons = diff.reasons()
    assert any("invariant 'precision' changed" in r for r in reasons)
    assert any("'workers' changed but was not declared" in r for r in reasons)
    assert any("'compile' did not happen" in r for r in reasons)


def test_a_setting_present_on_one_side_only_is_a_change() -> None:
    diff = diff_contracts(_c(exe={}), _c(exe={"pin_memory": True}), [])
    assert diff.undeclared_changes == ["pin_memory"]


def test_observed_world_size_and_samples_are_checked_against_the_contract() -> None:
    c = _c({"global_batch": 64}, {"world_size": 2, "microbatch": 32})
    assert check_observed(c, world_size=2, samples_per_step=64) == []
    problems = check_observed(c, world_size=1, samples_per_step=32)
    assert len(problems) == 2


def test_repeated_windows_of_one_side_must_share_a_contract() -> None:
    assert same_contract([_c({"m": 1}), _c({"m": 1})]) == []
    assert same_contract([_c({"m": 1}), _c({"m": 2})]) == [
        "invariants.m differs between windows of the same side"
    ]


def test_a_global_batch_declared_alone_is_left_to_the_measured_batch() -> None:
    """Without microbatch there is no product to check; the run holds global_batch to what it measures."""
    assert check_contract(_c({"global_batch": 32, "model": "m"}, {})) == []
    assert check_contract(_c({"global_batch": 32}, {"world_size": 2, "accumulation": 2})) == []
    # microbatch x accumulation with no data-parallel size is one process's: 16, not the declared 32
    (problem,) = check_contract(_c({"global_batch": 32}, {"microbatch": 8, "accumulation": 2}))
    assert "x data_parallel 1 = 16" in problem
    from perfgate.benchmarking.workload.contract import check_observed

    (observed,) = check_observed(_c({"global_batch": 32}, {}), world_size=1, samples_per_step=64)
    assert "declares global_batch 32 but the ranks processed 64" in observed
