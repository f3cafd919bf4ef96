"""``python -m perfgate.harness [options] -- script.py ARGS`` (or ``-- -m package.module ARGS``).

Runs the training script as ``__main__`` in this process, with each optimizer update timed as one
step. Works under ``torchrun ... -m perfgate.harness -- train.py``: every rank times itself and
writes its own record. Options default to the ``PERFGATE_*`` environment.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import time
from collections.abc import Sequence
from dataclasses import replace

from perfgate.harness import _state
from perfgate.harness.config import ConfigError, HarnessConfig, ProfileConfig
from perfgate.harness.window import NO_STEP_EXIT, NoStepFound, Window, WindowComplete

__all__ = ["build_parser", "main"]

DEFAULT_RECORD_DIR = "perfgate-records"
_now = time.perf_counter_ns


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m perfgate.harness",
        description="Time steady-state training steps inside the training process.",
        epilog="Everything after '--' is the training script and its arguments (or -m MODULE ARGS).",
    )
    p.add_argument("--record-dir", help=f"where rank<N>.json records go (default ./{DEFAULT_RECORD_DIR})")
    p.add_argument("--warmup-steps", type=int, help="steps excluded before the first window (default 5)")
    p.add_argument("--measure-steps", type=int, help="steps per measured window (default 20)")
    p.add_argument("--windows", type=int, help="consecutive windows in this run (default 1)")
    stop = p.add_mutually_exclusive_group()
    stop.add_argument(
        "--stop",
        dest="stop",
        action="store_true",
        default=None,
        help="end the run after the windows (default)",
    )
    stop.add_argument("--finish", dest="stop", action="store_false", help="let the script run to its end")
    p.add_argument(
        "--timing",
        choices=["optimizer", "explicit"],
        help="optimizer hooks (default) or the script's own Window",
    )
    p.add_argument(
        "--samples-per-step",
        type=int,
        help="samples per step on this rank (default: from DataLoader batches)",
    )
    p.add_argument("--tokens-per-step", type=int, help="tokens per step on this rank")
    p.add_argument(
        "--no-data-wait",
        dest="data_wait",
        action="store_false",
        default=None,
        help="do not time DataLoader waits",
    )
    p.add_argument(
        "--no-backward", dest="backward", action="store_false", default=None, help="do not time backward()"
    )
    p.add_argument("--device-events", choices=["auto", "on", "off"], help="per-step device timing events")
    p.add_argument(
        "--progress-every", type=int, help="print a progress line to stderr every N steps (rank 0)"
    )
    p.add_argument("--label", help="free-form label stored in the record")
    prof = p.add_argument_group("profiling (one Kineto trace per rank; the record is flagged profiled)")
    prof.add_argument("--profile-dir", help="enable torch.profiler and write rank<N>.pt.trace.json here")
    prof.add_argument("--profile-skip-first", type=int, default=None)
    prof.add_argument("--profile-wait", type=int, default=None)
    prof.add_argument("--profile-warmup", type=int, default=None, help=">= 1")
    prof.add_argument("--profile-active", type=int, default=None)
    prof.add_argument("--profile-record-shapes", action="store_true", default=None)
    prof.add_argument("--profile-with-flops", action="store_true", default=None)
    prof.add_argument("--profile-memory", action="store_true", default=None)
    prof.add_argument("--profile-with-stack", action="store_true", default=None)
    prof.add_argument(
        "--profile-with-modules",
        action="store_true",
        default=None,
        help="name each nn.Module call (qualified name) in the trace",
    )
    return p


def _config_from_args(ns: argparse.Namespace) -> HarnessConfig:
    cfg = HarnessConfig.from_env()
    events = {"auto": None, "on": True, "off": False}
    cfg = cfg.with_overrides(
        record_dir=ns.record_dir,
        warmup_steps=ns.warmup_steps,
        measure_steps=ns.measure_steps,
        windows=ns.windows,
        stop=ns.stop,
        timing=ns.timing,
        samples_per_step=ns.samples_per_step,
        tokens_per_step=ns.tokens_per_step,
        data_wait=ns.data_wait,
        backward=ns.backward,
        progress_every=ns.progress_every,
        label=ns.label,
    )
    if ns.device_events is not None:
        cfg = replace(cfg, device_events=events[ns.device_events])
    if cfg.record_dir is None:
        cfg = cfg.with_overrides(record_dir=DEFAULT_RECORD_DIR)
    profile_dir = ns.profile_dir or (cfg.profile.trace_dir if cfg.profile else None)
    if profile_dir is not None:
        base = cfg.profile or ProfileConfig(trace_dir=profile_dir)
        fields = {
            "trace_dir": profile_dir,
            "skip_first": ns.profile_skip_first,
            "wait": ns.profile_wait,
            "warmup": ns.profile_warmup,
            "active": ns.profile_active,
            "record_shapes": ns.profile_record_shapes,
            "with_flops": ns.profile_with_flops,
            "profile_memory": ns.profile_memory,
            "with_stack": ns.profile_with_stack,
            "with_modules": ns.profile_with_modules,
        }
        chosen = {k: v for k, v in fields.items() if v is not None}
        cfg = replace(cfg, profile=replace(base, **chosen))  # pyright: ignore[reportArgumentType] -- field names above
    return cfg


# Options that take no value; every other option of build_parser() takes exactly one.
_FLAGS = {
    "-h",
    "--help",
    "--stop",
    "--finish",
    "--no-data-wait",
    "--no-backward",
    "--profile-record-shapes",
    "--profile-with-flops",
    "--profile-memory",
    "--profile-with-stack",
    "--profile-with-modules",
}


def _split_target(argv: list[str], parser: argparse.ArgumentParser) -> tuple[argparse.Namespace, list[str]]:
    """Options and the target: the harness options come first, then ``--`` and the target. Without
    the ``--`` (torchrun drops a leading one from script arguments) the first token that is not a
    harness option starts the target; a later ``--`` belongs to the script."""
    i = 0
    while i < len(argv) and argv[i] != "--" and (argv[i].startswith("--") or argv[i] == "-h"):
        i += 1 if argv[i] in _FLAGS or "=" in argv[i] else 2
    opts, target = argv[:i], argv[i:]
    if target[:1] == ["--"]:
        target = target[1:]
    parsed = parser.parse_args(opts)  # first, so that -h prints the help
    if not target or (target[0] == "-m" and len(target) < 2):
        raise ConfigError(
            "give the training script after '--': python -m perfgate.harness [opts] -- train.py ARGS"
        )
    return parsed, target


def main(argv: Sequence[str] | None = None) -> int:
    """Run the target under the harness; returns the process exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        opts, target = _split_target(args, parser)
        cfg = _config_from_args(opts)
    except ConfigError as exc:
        parser.error(str(exc))
    from perfgate.harness._node import slurm_rank_env

    # srun started this process as one rank: torch.distributed reads RANK/WORLD_SIZE/... (set before
    # the script runs, so its init_process_group sees them).
    os.environ.update(slurm_rank_env(dict(os.environ)))
    _state.set_launcher_config(cfg)
    # The launch id the server gave this launch (every rank shares it), else a new one whatever the
    # environment inherited: sample records and dumps of this process and its loader workers carry it.
    from perfgate.harness.samples import start_launch

    start_launch()
    from perfgate.harness.startup import StartupSampler

    sampler = StartupSampler()
    _state.set_startup(sampler)
    sampler.start()
    window: Window | None = None
    torch_import_ns = 0
    if cfg.timing == "optimizer":
        from perfgate.harness import hooks

        imported = "torch" in sys.modules
        started = _now()
        hooks.install_optimizer_hook()  # imports torch: the script's own work, done early
        torch_import_ns = 0 if imported else _now() - started
        window = Window(config=cfg, _optimizer_mode=True)
    status = 0
    reason = "script_exit"
    error: str | None = None
    stopped: str | None = None
    _state.set_startup_own(max(0, _now() - harness_imported_ns() - torch_import_ns))
    try:
        _run_target(target)
    except WindowComplete:
        reason = "window_complete"
    except NoStepFound as exc:
        status, reason, error = NO_STEP_EXIT, "no_step_found", exc.message
        stopped = exc.message
    except SystemExit as exc:
        status = _exit_status(exc.code)
        reason = "script_exit"
        if status:
            error = f"SystemExit: {exc.code}"
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}"
        _close(window, "script_error", error)
        raise
    finally:
        _state.set_launcher_config(None)
        sampler.stop()
    _close(window, reason, error)
    if stopped is not None:
        print(f"[perfgate] {stopped}", file=sys.stderr, flush=True)  # the last line: what the answer quotes
    return status


def _close(window: Window | None, reason: str, error: str | None) -> None:
    targets = [w for w in (window, _state.active_window()) if w is not None]
    for w in dict.fromkeys(targets):
        path = w.close(reason, error)
        if path is not None and w.rank.rank == 0:
            print(f"[perfgate] record written: {path}", file=sys.stderr, flush=True)


def harness_imported_ns() -> int:
    """When ``perfgate.harness`` began importing (perf_counter ns): where the launcher's start-up starts."""
    package = sys.modules["perfgate.harness"]
    return int(getattr(package, "IMPORT_STARTED_NS", _now()))


def _run_target(target: list[str]) -> None:
    if target[0] == "-m":
        sys.argv = [target[1], *target[2:]]
        runpy.run_module(target[1], run_name="__main__", alter_sys=True)
        return
    script = target[0]
    sys.argv = list(target)
    # As `python script.py` would: the script's directory first on the import path.
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1
