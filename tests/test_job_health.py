"""Health over the whole job: every logged line and every step the harness records, not only the measured
windows. The log excerpts are real trainer output from public threads (cited per excerpt); where a test
changes one, the comment says how."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from perfgate.benchmarking.reading.logformats import parse_log
from perfgate.benchmarking.reading.loglines import read_log_lines
from perfgate.benchmarking.reading.records import decode_record
from perfgate.benchmarking.runs.health import health_of, job_health_of_launches, loss_spikes
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig

# nanoGPT diverging to NaN right after an evaluation, with its user's timestamp before each line (the issue's
# markdown '> ' quoting and blank lines removed): https://github.com/karpathy/nanoGPT/issues/215
NANOGPT_NAN_TAIL = """\
2023-03-22 09:30:39 iter 2920: loss 3.9883, time 1099.34ms, mfu 15.34%
2023-03-22 09:30:50 iter 2930: loss 3.9408, time 1097.30ms, mfu 15.34%
2023-03-22 09:31:01 iter 2940: loss 3.9994, time 1097.68ms, mfu 15.34%
2023-03-22 09:31:12 iter 2950: loss 4.0977, time 1096.94ms, mfu 15.34%
2023-03-22 09:31:23 iter 2960: loss 4.1535, time 1097.23ms, mfu 15.34%
2023-03-22 09:31:34 iter 2970: loss 3.9453, time 1097.65ms, mfu 15.34%
2023-03-22 09:31:45 iter 2980: loss 3.8993, time 1099.18ms, mfu 15.34%
2023-03-22 09:31:56 iter 2990: loss 3.8853, time 1096.65ms, mfu 15.34%
2023-03-22 09:32:32 step 3000: train loss 4.0390, val loss 4.0427
saving checkpoint to out
2023-03-22 09:32:41 iter 3000: loss 4.2490, time 35392.33ms, mfu 13.85%
2023-03-22 09:32:52 iter 3010: loss nan, time 1019.95ms, mfu 14.12%
2023-03-22 09:33:02 iter 3020: loss nan, time 1015.95ms, mfu 14.36%
2023-03-22 09:33:12 iter 3030: loss nan, time 1017.59ms, mfu 14.58%
2023-03-22 09:33:22 iter 3040: loss nan, time 1016.57ms, mfu 14.78%
2023-03-22 09:33:33 iter 3050: loss nan, time 1016.74ms, mfu 14.95%
2023-03-22 09:33:43 iter 3060: loss nan, time 1018.23ms, mfu 15.11%
"""

# nanoGPT on shakespeare-char, a healthy falling loss:
# https://github.com/karpathy/nanoGPT/issues/178 (comment by otaviogood, 2023-02-24)
NANOGPT_178 = """\
iter 0: loss 4.2648, time 9371.81ms, mfu -100.00%
iter 10: loss 3.2202, time 893.76ms, mfu 16.68%
iter 20: loss 2.7697, time 894.88ms, mfu 16.67%
iter 30: loss 2.6104, time 893.50ms, mfu 16.68%
iter 40: loss 2.5339, time 893.90ms, mfu 16.68%
iter 50: loss 2.5026, time 894.09ms, mfu 16.67%
iter 60: loss 2.4706, time 895.86ms, mfu 16.67%
iter 70: loss 2.4851, time 894.67ms, mfu 16.67%
iter 80: loss 2.4363, time 904.07ms, mfu 16.65%
iter 90: loss 2.4392, time 893.38ms, mfu 16.65%
iter 100: loss 2.4049, time 929.71ms, mfu 16.59%
iter 110: loss 2.3950, time 892.77ms, mfu 16.60%
iter 120: loss 2.3203, time 913.16ms, mfu 16.57%
iter 130: loss 2.2558, time 894.64ms, mfu 16.58%
iter 140: loss 2.2287, time 893.37ms, mfu 16.59%
iter 150: loss 2.1278, time 895.55ms, mfu 16.60%
iter 160: loss 2.0495, time 922.19ms, mfu 16.55%
iter 170: loss 1.9908, time 893.89ms, mfu 16.57%
iter 180: loss 1.9392, time 894.75ms, mfu 16.58%
iter 190: loss 1.8510, time 894.19ms, mfu 16.59%
iter 200: loss 1.8447, time 895.36ms, mfu 16.59%
iter 210: loss 1.7943, time 893.15ms, mfu 16.60%
iter 220: loss 1.7208, time 892.75ms, mfu 16.61%
iter 230: loss 1.7159, time 894.08ms, mfu 16.62%
iter 240: loss 1.6524, time 895.31ms, mfu 16.62%
"""
# the same log with one step's loss jumping and coming back (iter 200's 1.8447 replaced by 9.9: the issue's
# "2.1 -> 9.9 for one step" case)
NANOGPT_SPIKE = NANOGPT_178.replace("iter 200: loss 1.8447", "iter 200: loss 9.9000")

# Megatron-LM (fp16) at its first logged line: ten iterations skipped while the dynamic loss scale fell from
# Megatron's initial 2^32 to 2^23; the next line is cut where the thread's excerpt ends.
# https://github.com/NVIDIA/nccl/issues/743 (turn 2)
MEGATRON_FP16_START = """\
 iteration       10/ 1000000 | consumed samples:           40 | elapsed time per iteration (ms): 356.2 | learning rate: 0.000E+00 | global batch size:     4 | loss scale: 8388608.0 | number of skipped iterations:  10 | number of nan iterations:   0 |
 iteration       20/ 1000000 | consumed samples:           80 | elapsed time per iteration (ms): 140.6 | learning rate: 2.020E-08 | global batch size:     4 | lm loss: 1.005022E+01 | sop loss: 8.174902E-01 | loss scale: 32768.0 | grad norm: 217.199 | number of skipp
"""

# Megatron-LM (bf16: the scale stays 1.0, no skips): https://github.com/epfLLM/Megatron-LLM/issues/11 (turn 3)
MEGATRON_BF16 = """\
 iteration      182/  250000 | consumed samples:       186368 | elapsed time per iteration (ms): 126995.3 | learning rate: 1.365E-05 | global batch size:  1024 | lm loss: 2.382640E+00 | loss scale: 1.0 | grad norm: 0.227 | number of skipped iterations:   0 | number of nan iterations:   0 |
 iteration      183/  250000 | consumed samples:       187392 | elapsed time per iteration (ms): 125553.7 | learning rate: 1.372E-05 | global batch size:  1024 | lm loss: 2.471678E+00 | loss scale: 1.0 | grad norm: 0.134 | number of skipped iterations:   0 | number of nan iterations:   0 |
 iteration      184/  250000 | consumed samples:       188416 | elapsed time per iteration (ms): 127804.5 | learning rate: 1.380E-05 | global batch size:  1024 | lm loss: 2.408367E+00 | loss scale: 1.0 | grad norm: 0.270 | number of skipped iterations:   0 | number of nan iterations:   0 |
"""


def _megatron_fp16(scales: list[float], skipped: list[int]) -> str:
    """Lines of the epfLLM/Megatron-LLM#11 shape above with the loss scale and skipped counts replaced: an fp16
    run whose scale keeps falling (constructed: no public excerpt of a full collapse in Megatron's format)."""
    rows = MEGATRON_BF16.splitlines()
    out = []
    for k, (scale, skip) in enumerate(zip(scales, skipped, strict=True)):
        row = rows[k % 3].replace(f"{182 + k % 3}/", f"{182 + k}/")
        row = row.replace("loss scale: 1.0", f"loss scale: {scale:.1f}")
        out.append(row.replace("skipped iterations:   0", f"skipped iterations:   {skip}"))
    return "\n".join(out) + "\n"


def _parse(text: str, fmt: str = "nanogpt") -> Any:
    return parse_log(read_log_lines(io.BytesIO(text.encode())), fmt)  # type: ignore[arg-type]


def test_a_real_falling_loss_has_no_spike_and_a_one_step_jump_is_one() -> None:
    assert loss_spikes((e.step, e.loss) for e in _parse(NANOGPT_178).entries) == []
    (spike,) = health_of(_parse(NANOGPT_SPIKE).entries).spikes
    assert spike.step == 200 and spike.loss == 9.9
    # judged against the 20 losses before it (iter 0..190): median 2.4206, and a wide spread, since the loss
    # was still falling fast: the limit is median + 6 x 1.4826 x MAD = 3.998, far below 9.9
    assert spike.median == pytest.approx(2.4206)
    assert spike.limit == pytest.approx(3.99779, abs=1e-4)


def test_skips_under_a_falling_loss_scale_are_amp_overflows_and_a_collapse_is_named() -> None:
    start = _parse(MEGATRON_FP16_START, "megatron")
    assert len(start.entries) == 1 and start.refused_steps == 1  # the cut second line is no step
    h = health_of(start.entries, initial_scale=2.0**32)  # Megatron's default --initial-loss-scale
    assert (h.skipped_iterations, h.explained_skips, h.unexplained_skips) == (10, 10, 0)
    assert h.job_verdict == "unknown"  # no lm loss on that line: nothing to judge the loss by

    collapse = health_of(_parse(_megatron_fp16([4.0, 2.0, 1.0, 1.0], [0, 1, 1, 0]), "megatron").entries)
    assert collapse.scale_collapse_step == 184 and collapse.scale_drops == 2
    assert (collapse.explained_skips, collapse.unexplained_skips) == (2, 0)
    assert collapse.job_verdict == "unhealthy" and "collapsed to 1" in " ".join(collapse.findings)

    stuck = health_of(_parse(_megatron_fp16([65536.0] * 3, [0, 1, 0]), "megatron").entries)
    assert (
        stuck.unexplained_skips == 1 and stuck.job_verdict == "unhealthy"
    )  # a skip the scale does not explain

    bf16 = health_of(_parse(MEGATRON_BF16, "megatron").entries)
    assert bf16.scale_collapse_step is None and bf16.job_verdict == "healthy"  # 1.0 throughout is no collapse


# --------------------------------------------------------------------------- through the tools


async def _calls(workspace: Path, calls: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        for tool, args in calls:
            r = await client.call_tool(tool, args)
            assert not r.is_error, r.content[0].text  # type: ignore[union-attr]
            out.append(r.structured_content or {})
    return out


@pytest.mark.anyio
async def test_a_nan_after_the_last_window_fails_the_health_check(workspace: Path) -> None:
    (workspace / "train.log").write_text(NANOGPT_NAN_TAIL)
    imported = {
        "paths": ["train.log"],
        "format": "nanogpt",
        "warmup_steps": 0,
        "measure_steps": 8,
        "windows": 1,
    }
    (got,) = await _calls(workspace, [("import_benchmark", imported)])
    assert (got["health"]["first_step"], got["health"]["last_step"]) == (2920, 2990)
    assert got["health"]["verdict"] == "healthy"  # the window holds no NaN: what health used to judge
    job = got["job_health"]
    assert job["verdict"] == "unhealthy" and (job["first_step"], job["last_step"]) == (2920, 3060)
    assert job["nonfinite_loss_steps"] == [3010, 3020, 3030, 3040, 3050, 3060]
    (check,) = await _calls(workspace, [("check_training_health", {"evidence_id": got["evidence_id"]})])
    assert check["state"] == "failed" and check["failed_checks"] == ["finite"]
    (finite,) = [c for c in check["checks"] if c["name"] == "finite"]
    assert "[3010, 3020, 3030, 3040, 3050, 3060]" in finite["detail"]


@pytest.mark.anyio
async def test_a_one_step_spike_fails_unless_tolerated(workspace: Path) -> None:
    (workspace / "spike.log").write_text(NANOGPT_SPIKE)
    (workspace / "clean.log").write_text(NANOGPT_178)
    args = {"format": "nanogpt", "warmup_steps": 5, "measure_steps": 5, "windows": 1}
    spiky, clean = await _calls(
        workspace,
        [
            ("import_benchmark", {"paths": ["spike.log"], **args}),
            ("import_benchmark", {"paths": ["clean.log"], **args}),
        ],
    )
    assert spiky["health"]["verdict"] == "healthy"  # steps 50..90: the spike at 200 lies after the window
    assert [s["step"] for s in spiky["job_health"]["loss_spikes"]] == [200]
    strict, tolerant, healthy = await _calls(
        workspace,
        [
            ("check_training_health", {"evidence_id": spiky["evidence_id"]}),
            ("check_training_health", {"evidence_id": spiky["evidence_id"], "max_loss_spikes": 1}),
            ("check_training_health", {"evidence_id": clean["evidence_id"]}),
        ],
    )
    assert strict["failed_checks"] == ["loss_spikes"]
    (detail,) = [c["detail"] for c in strict["checks"] if c["name"] == "loss_spikes"]
    assert (
        detail.startswith("1 loss spike(s) (at most 0): step 200: 9.9 >")
        and "median of the previous 20" in detail
    )
    assert tolerant["state"] == "passed" and healthy["state"] == "passed"


@pytest.mark.anyio
async def test_a_loss_scale_collapse_fails_the_health_check(workspace: Path) -> None:
    (workspace / "fp16.log").write_text(_megatron_fp16([8.0, 4.0, 2.0, 1.0, 1.0, 1.0], [0, 1, 1, 1, 0, 0]))
    imported = {"paths": ["fp16.log"], "format": "megatron", "warmup_steps": 0, "windows": 1}
    (got,) = await _calls(workspace, [("import_benchmark", imported)])
    assert got["job_health"]["loss_scale_collapse_step"] == 185
    (check,) = await _calls(workspace, [("check_training_health", {"evidence_id": got["evidence_id"]})])
    assert check["failed_checks"] == ["loss_scale"]


# --------------------------------------------------------------------------- the harness

torch = pytest.importorskip("torch")


def _train_with_a_nan_at(nan_at: int, steps: int, **config: Any) -> dict[str, Any]:
    """SGD on a fixed batch; at ``nan_at`` the loss is NaN and its update is dropped (no poisoned weights)."""
    from perfgate.harness import HarnessConfig, Window, hooks

    hooks.install_optimizer_hook()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    with Window(config=HarnessConfig(**config), _optimizer_mode=True) as w:
        for step in range(steps):
            loss = torch.nn.functional.mse_loss(model(x), y)
            if step == nan_at:
                loss = loss * float("nan")
            loss.backward()
            if step == nan_at:
                opt.zero_grad(set_to_none=True)  # the update is skipped: the weights stay finite
            opt.step()
            opt.zero_grad(set_to_none=True)
    return w.to_record()


@pytest.mark.parametrize(
    ("nan_at", "where"),
    [(1, "in the warm-up"), (9, "after the last window")],
)
def test_the_harness_records_losses_outside_the_windows(nan_at: int, where: str) -> None:
    record = _train_with_a_nan_at(nan_at, 11, warmup_steps=3, measure_steps=6, guard_steps=2)
    (win,) = record["windows"]
    assert (win["first_step"], win["last_step"]) == (3, 8) and win["nonfinite_loss_steps"] == []
    outside = record["outside_windows"]
    assert outside["nonfinite_loss_steps"] == [nan_at], where
    assert sorted([s for s, _ in outside["loss"]] + [nan_at]) == [0, 1, 2, 9, 10]
    rank = decode_record(json.dumps(record).encode(), "rank0.json")
    job = job_health_of_launches([[rank]])
    assert job is not None and job.nonfinite_loss_steps == [nan_at] and job.job_verdict == "unhealthy"
    assert (job.first_step, job.last_step, job.losses_seen) == (0, 10, 11)


def test_a_gradscaler_skip_in_the_warm_up_is_recorded_outside_the_windows() -> None:
    from perfgate.harness import HarnessConfig, Window, hooks

    hooks.install_optimizer_hook()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    with Window(config=HarnessConfig(warmup_steps=3, measure_steps=4), _optimizer_mode=True) as w:
        for step in range(8):
            scaled = scaler.scale(torch.nn.functional.mse_loss(model(x), y))
            (scaled * float("inf") if step == 1 else scaled).backward()  # an overflow: the update is skipped
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
    record = w.to_record()
    assert record["outside_windows"]["skipped_steps"] == [[1, 1]]  # merged into the step that ended next
    assert record["windows"][0]["skipped_steps"] == []
    job = job_health_of_launches([[decode_record(json.dumps(record).encode(), "rank0.json")]])
    assert job is not None and (job.skipped_iterations, job.explained_skips, job.unexplained_skips) == (
        1,
        1,
        0,
    )
