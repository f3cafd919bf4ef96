"""What the comparison says about training the candidate may change: model, data, loss; unknown is never 'same'."""

from __future__ import annotations

from perfgate.benchmarking.runs.training import LOSS_RTOL, ModelShape, SideTraining, training_differences

GPT = ModelShape("model.GPT", 1_000_000, "a" * 32)
LOSSES = {10: 2.5, 11: 2.45, 12: 2.41}


def side(
    model: ModelShape | None = GPT,
    stream: str | None = "s1",
    losses: dict[int, float] | None = None,
    n: int = 2,
) -> SideTraining:
    return SideTraining(
        models=[model] * n, streams=[stream] * n, losses=[dict(LOSSES if losses is None else losses)] * n
    )


def test_an_unchanged_training_differs_in_nothing_and_checks_everything() -> None:
    check = training_differences(side(), side())
    assert check.differs == [] and check.unchecked == []


def test_a_smaller_model_is_named_with_both_parameter_counts() -> None:
    check = training_differences(side(), side(ModelShape("model.GPT", 500_000, "b" * 32)))
    assert check.differs == ["model size: 1,000,000 -> 500,000 parameters (0.50x, model.GPT)"]


def test_the_same_parameter_count_in_another_shape_is_still_a_model_change() -> None:
    """Swapping two layers' widths keeps the count; the structure digest still tells them apart."""
    check = training_differences(side(), side(ModelShape("model.GPT", 1_000_000, "c" * 32)))
    assert [d.split(":")[0] for d in check.differs] == ["model structure"]


def test_a_loss_that_moves_beyond_the_tolerance_is_named_by_step() -> None:
    moved = {s: v * (1 + 3 * LOSS_RTOL) for s, v in LOSSES.items()}
    check = training_differences(side(), side(losses=moved))
    assert check.differs[0].startswith("loss: 3 of 3 common steps differ (step 10 2.5 -> ")


def test_a_loss_within_reduction_noise_is_the_same_training() -> None:
    nudged = {s: v * (1 + LOSS_RTOL / 10) for s, v in LOSSES.items()}
    assert training_differences(side(), side(losses=nudged)).differs == []


def test_a_nondeterministic_baseline_widens_the_margin_by_its_own_spread_only() -> None:
    """The baseline's launches move by 0.2 at step 10: a candidate within twice that is the same training,
    one far outside it is not; a candidate whose own launches scatter does not widen anything."""
    noisy = SideTraining(models=[GPT, GPT], streams=["s1", "s1"], losses=[LOSSES, {**LOSSES, 10: 2.7}])
    assert training_differences(noisy, side(losses={**LOSSES, 10: 2.9})).differs == []
    far = training_differences(noisy, side(losses={**LOSSES, 10: 9.0}))
    assert far.differs == ["loss: 1 of 3 common steps differ (step 10 2.6 -> 9)"]
    scattered = SideTraining(
        models=[GPT, GPT, GPT], streams=["s1"] * 3, losses=[{10: 1.0}, {10: 5.0}, {10: 9.0}]
    )
    assert training_differences(side(), scattered).differs[0].startswith("loss: 1 of 1 common steps differ")


def test_a_side_with_no_model_record_is_unchecked_never_the_same() -> None:
    """A candidate whose model went unrecorded (no training forward seen) does not pass as the same model."""
    check = training_differences(side(), SideTraining(models=[None], streams=["s1"], losses=[LOSSES]))
    assert check.differs == []
    assert "model size (candidate: no top-level module recorded)" in check.unchecked


def test_one_unrecorded_launch_among_recorded_ones_makes_the_model_unchecked() -> None:
    cand = SideTraining(models=[GPT, None], streams=["s1", "s1"], losses=[LOSSES, LOSSES])
    assert any(u.startswith("model size") for u in training_differences(side(), cand).unchecked)


def test_other_first_inputs_are_a_data_change() -> None:
    check = training_differences(side(), side(stream="s2"))
    assert check.differs == ["data: the first training inputs differ (sample-stream digest)"]


def test_no_common_step_leaves_the_loss_unchecked() -> None:
    check = training_differences(side(), side(losses={99: 1.0}))
    assert "loss (the sides recorded no step in common)" in check.unchecked
