"""What the harness measured beyond step times: the batch, samples and backward passes per step, the data
stream, the environment, and their check against the contract (`perfgate.benchmarking.runs.measured`)."""

from __future__ import annotations

import msgspec

from _window_records import rank_record
from perfgate.benchmarking import Contract
from perfgate.benchmarking.reading.records import DeviceRecord
from perfgate.benchmarking.runs.measured import (
    backward_per_step,
    launch_stream,
    measured_batch,
    measured_environment,
    observe_batch,
    samples_per_step,
    window_health,
)


def test_samples_per_step_sum_the_ranks_over_the_measured_steps_only() -> None:
    # The warm-up delivers other batch sizes; only the measured steps count.
    ranks = [rank_record(r, world=2, samples=[1, 2, 8, 8, 8, 8]) for r in (0, 1)]
    assert samples_per_step(ranks, warmup_steps=2) == 16


def test_samples_per_step_are_unknown_when_a_step_was_not_counted_or_the_count_varies() -> None:
    assert samples_per_step([rank_record(samples=[8, 8, 8, None, 8, 8])], 2) is None
    assert samples_per_step([rank_record(samples=[8, 8, 8, 4, 8, 8])], 2) is None
    assert samples_per_step([], 2) is None


def test_the_batch_that_reached_the_model_beats_the_data_loaders_count() -> None:
    ranks = [rank_record(r, world=2, samples=8, model_samples=[0, 0, 4, 4, 4, 4]) for r in (0, 1)]
    assert measured_batch(ranks, 2, loader=16) == (8, "model_inputs")


def test_without_model_inputs_the_batch_is_the_loaders_count_or_unverified() -> None:
    assert measured_batch([rank_record()], 2, loader=8) == (8, "data_loader")
    assert measured_batch([rank_record(model_samples=[4, 4, 4, None, 4, 4])], 2, loader=None) == (
        None,
        "unverified",
    )


def test_backward_passes_per_step_need_every_window_to_agree_on_a_whole_number() -> None:
    assert backward_per_step([rank_record(measure=4, backward_calls=8)]) == 2
    assert backward_per_step([rank_record(measure=4, backward_calls=6)]) is None  # 1.5 per step
    two = [rank_record(0, world=2, backward_calls=4), rank_record(1, world=2, backward_calls=8)]
    assert backward_per_step(two) is None
    assert backward_per_step([rank_record(backward_calls=None)]) is None
    assert backward_per_step([rank_record(backward_calls=8, timing="explicit")]) is None


def test_a_launchs_stream_joins_every_ranks_digest_in_rank_order() -> None:
    one = rank_record(sample_stream="a" * 32)
    assert launch_stream([one]) == "a" * 32
    r0, r1 = rank_record(0, world=2, sample_stream="a" * 32), rank_record(1, world=2, sample_stream="b" * 32)
    joined = launch_stream([r1, r0])
    assert joined == launch_stream([r0, r1]) and joined is not None and len(joined) == 32
    assert launch_stream([r0, rank_record(1, world=2)]) is None


def test_the_measured_environment_is_rank_zeros_device_software_and_runtime_settings() -> None:
    record = rank_record(
        device=DeviceRecord(kind="cuda", name="H100", runtime_version="12.4"),
        torch_version="2.5.1",
        python="3.12.1",
        runtime_env={"num_threads": "8"},
    )
    assert measured_environment(record) == {
        "device_kind": "cuda",
        "device_name": "H100",
        "device_runtime": "12.4",
        "torch_version": "2.5.1",
        "python_version": "3.12.1",
        "num_threads": "8",
    }
    assert set(measured_environment(None).values()) == {None}


def test_a_measured_batch_that_contradicts_the_contract_is_a_problem() -> None:
    contract = Contract({"global_batch": 32}, {"accumulation": 4})
    seen = observe_batch(contract, 1, [rank_record(samples=8, backward_calls=8)], 2, declared_samples=None)
    assert (seen.samples_per_step, seen.batch, seen.source) == (8, 8, "data_loader")
    assert any("accumulation 4" in p and "2 backward" in p for p in seen.problems)


def test_declared_samples_per_step_must_match_what_the_harness_counted() -> None:
    seen = observe_batch(Contract(), 1, [rank_record(samples=8)], 2, declared_samples=16)
    assert seen.problems == [
        "samples_per_step 16 was given, but the harness counted 8 samples per optimizer step"
    ]


def test_a_model_batch_unlike_the_loaders_is_named_and_the_loaders_count_is_checked() -> None:
    seen = observe_batch(Contract(), 1, [rank_record(samples=8, model_samples=4)], 2, declared_samples=None)
    assert (seen.samples_per_step, seen.batch, seen.source) == (8, 4, "model_inputs")
    assert (
        len(seen.warnings) == 1 and "held 4 samples" in seen.warnings[0] and "delivered 8" in seen.warnings[0]
    )
    assert seen.problems == []


def test_without_a_loader_count_the_model_batch_is_the_samples_per_step() -> None:
    seen = observe_batch(Contract(), 1, [rank_record(samples=None, model_samples=4)], 2, declared_samples=4)
    assert (seen.samples_per_step, seen.source, seen.problems, seen.warnings) == (4, "model_inputs", [], [])


def test_health_covers_the_windows_of_every_rank_and_is_absent_without_a_loss() -> None:
    assert window_health([rank_record()]) is None
    got = window_health([rank_record(windows=2, loss=[2.0, 1.5, 1.2, 1.0])])
    assert got is not None
    health, first, last = got
    assert (first, last) == (2, 9)
    assert health.verdict == "healthy" and health.losses_seen == 8


def test_a_non_finite_loss_on_any_rank_makes_the_run_unhealthy() -> None:
    r0 = rank_record(0, world=2, loss=[2.0, 1.5, 1.2, 1.0])
    r1 = rank_record(1, world=2, loss=[2.0, 1.5, 1.2, 1.0])
    bad = msgspec.structs.replace(r1.windows[0], nonfinite_loss_steps=[4])
    got = window_health([r0, msgspec.structs.replace(r1, windows=[bad])])
    assert got is not None
    assert got[0].verdict == "unhealthy" and got[0].nonfinite_loss_steps == [4]
