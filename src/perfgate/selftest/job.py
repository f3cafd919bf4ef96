"""`perfgate selftest`'s workload: runs in the training interpreter, on the device under test.

Copied into the selftest's temporary workspace and launched by perfgate's own tools (never imported by
the server). Two modes:

``train``   a small MLP trained with SGD on ``--device``. Before training it writes what torch reports
            about the device (``facts.json``) and, with ``--dump``, the parity dumps (bf16, fp8). It
            holds a ballast allocation of a known size during the window and copies each batch from
            host to device. After every optimizer step it synchronises the device and stamps the host
            clock: that independent wall-clock series (``clock.json``) is what the harness window is
            compared with. Under ``torchrun`` (2+ devices) the model is wrapped in DDP, so every step
            runs a gradient all-reduce.
``matmul``  a loop of square matmuls with a known FLOP count, timed with ``perfgate.harness.Window``.

Every file goes to ``--out``. A device that is asked for but absent ends the job with exit status 3
and the reason in ``facts.json``; nothing is simulated.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

EXIT_NO_DEVICE = 3


def _write(out: Path, name: str, value: Any) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{name}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(value, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, out / name)


def resolve_device(requested: str) -> tuple[str, str, Any, str | None]:
    """(kind, torch device type, torch device module or None, why not) for cuda|rocm|musa|cpu|auto.

    ``kind`` is the device the user names (rocm for a ROCm build of torch); the torch device type is
    what tensors are placed on (``cuda`` for ROCm builds, ``musa`` once torch_musa is imported).
    """
    import torch

    musa_reason: str | None = None
    if requested in ("musa", "auto") and not hasattr(torch, "musa"):
        try:
            import torch_musa  # noqa: F401  # pyright: ignore[reportMissingImports, reportUnusedImport]
        except ImportError as exc:
            musa_reason = f"torch_musa is not importable in this interpreter ({exc})"
    hip = getattr(torch.version, "hip", None)
    cuda_ok = torch.cuda.is_available()
    musa: Any = getattr(torch, "musa", None)
    musa_ok = musa is not None and bool(musa.is_available())
    if requested == "cpu":
        return "cpu", "cpu", None, None
    if requested == "cuda":
        if not cuda_ok:
            return "cuda", "cuda", None, "torch.cuda.is_available() is False in this interpreter"
        if hip:
            return (
                "cuda",
                "cuda",
                None,
                f"this torch is a ROCm build (torch.version.hip={hip}): use --device rocm",
            )
        return "cuda", "cuda", torch.cuda, None
    if requested == "rocm":
        if not hip:
            return "rocm", "cuda", None, "this torch is not a ROCm build (torch.version.hip is None)"
        if not cuda_ok:
            return "rocm", "cuda", None, "torch.cuda.is_available() is False in this ROCm build"
        return "rocm", "cuda", torch.cuda, None
    if requested == "musa":
        if not musa_ok:
            why = musa_reason or "torch.musa.is_available() is False in this interpreter"
            return "musa", "musa", None, why
        return "musa", "musa", musa, None
    # auto: the first accelerator this interpreter can use, else the host.
    if cuda_ok:
        return ("rocm" if hip else "cuda"), "cuda", torch.cuda, None
    if musa_ok:
        return "musa", "musa", musa, None
    return "cpu", "cpu", None, None


def _driver_api_version(torch: Any, seen: str) -> str | None:
    """The CUDA driver API version the driver supports (what nvidia-smi calls 'CUDA Version'): torch's
    private wrapper where the build has it, else cuDriverGetVersion from libcuda (torch 2.11 builds
    dropped the wrapper; the environment probe asks the driver the same way)."""
    value = 0
    get = getattr(torch._C, "_cuda_getDriverVersion", None)
    if get is not None:
        try:
            value = int(get())
        except (RuntimeError, ValueError):
            value = 0
    elif seen == "cuda":
        import ctypes

        try:
            out = ctypes.c_int(0)
            if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(out)) == 0:
                value = out.value
        except (OSError, AttributeError):
            value = 0
    return f"{value // 1000}.{value % 1000 // 10}" if value > 0 else None


def facts(kind: str) -> dict[str, Any]:
    """What torch itself reports: the device under test, and (independently of the choice) the backend
    and devices this interpreter sees, which collect_env is checked against."""
    import torch

    seen, _, module, _ = resolve_device("auto")
    names: list[str] = []
    capability: list[str] = []
    count = 0
    if module is not None:
        count = int(module.device_count())
        for i in range(count):
            names.append(str(module.get_device_name(i)))
            get_cap = getattr(module, "get_device_capability", None)
            if get_cap is not None:
                major, minor = get_cap(i)
                capability.append(f"{major}.{minor}")
    runtime = {
        "cuda": getattr(torch.version, "cuda", None),
        "rocm": getattr(torch.version, "hip", None),
        "musa": getattr(torch.version, "musa", None),
        "cpu": None,
    }[seen]
    return {
        "kind": kind,
        "backend": seen,
        "torch_version": torch.__version__,
        "device_count": count,
        "device_names": names,
        "capability": capability,
        "runtime_version": runtime,
        "driver_api_version": _driver_api_version(torch, seen) if seen in ("cuda", "rocm") else None,
        "python": sys.executable,
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
    }


def write_parity_dumps(out: Path, dev: Any) -> dict[str, Any]:
    """Reference (host) and candidate (device) tensors for compare_tensors, plus a negative control.

    * bf16 exact: the same float32 values rounded to bf16 on the host and on the device; the bits must
      be identical (round-to-nearest-even on both), which also proves the dump keeps bf16 bits.
    * bf16 matmul: 64-term dot products of bf16-exact inputs in [-1, 1), computed on the device in bf16
      against a float64 host reference.
    * bf16 control: the device tensors with one element changed by 1.0; the comparison must fail.
    * fp8 (e4m3fn): values rounded on the host and on the device must be bit-identical; skipped with
      the reason where the device cannot convert to float8.
    """
    import torch

    from perfgate.harness import dump_tensors

    g = torch.Generator().manual_seed(1234)
    base = torch.rand(64, 64, generator=g) * 8.0 - 4.0
    a = (torch.rand(32, 64, generator=g) * 2.0 - 1.0).to(torch.bfloat16)
    b = (torch.rand(64, 48, generator=g) * 2.0 - 1.0).to(torch.bfloat16)
    reference = {"exact": base.to(torch.bfloat16), "matmul": a.double() @ b.double()}
    on_device = {
        "exact": base.to(dev).to(torch.bfloat16),
        "matmul": a.to(dev) @ b.to(dev),
    }
    control = {k: v.detach().clone() for k, v in on_device.items()}
    control["exact"][3, 5] += 1.0
    dump_tensors(out / "bf16-ref.safetensors", reference)
    dump_tensors(out / "bf16-dev.safetensors", on_device)
    dump_tensors(out / "bf16-control.safetensors", control)
    result: dict[str, Any] = {"bf16": True, "matmul_k": 64}
    fp8 = getattr(torch, "float8_e4m3fn", None)
    if fp8 is None:
        result["fp8"] = False
        result["fp8_reason"] = f"torch {torch.__version__} has no float8_e4m3fn dtype"
        return result
    values = torch.rand(64, 64, generator=g) * 400.0 - 200.0
    try:
        device_fp8 = values.to(dev).to(fp8)
        device_fp8.view(torch.uint8).sum().item()  # force the conversion to run on the device now
    except (RuntimeError, TypeError, NotImplementedError) as exc:
        result["fp8"] = False
        result["fp8_reason"] = f"the device cannot convert float32 to float8_e4m3fn: {exc}"
        return result
    dump_tensors(out / "fp8-ref.safetensors", {"e4m3": values.to(fp8)})
    dump_tensors(out / "fp8-dev.safetensors", {"e4m3": device_fp8})
    result["fp8"] = True
    return result


def _sync_fn(module: Any) -> Any:
    if module is None:
        return lambda: None
    return module.synchronize


def train(args: argparse.Namespace) -> int:
    import torch
    from torch import nn

    from perfgate.harness import WindowComplete

    out = Path(args.out)
    kind, dev_type, module, why = resolve_device(args.device)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if why is not None:
        if rank == 0:
            _write(out, "facts.json", {"kind": kind, "error": why})
        print(f"selftest job: device {args.device!r} unavailable: {why}", file=sys.stderr)
        return EXIT_NO_DEVICE
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device(dev_type, local) if module is not None else torch.device("cpu")
    if module is not None:
        module.set_device(local)
    torch.manual_seed(args.seed)  # pyright: ignore[reportUnknownMemberType]
    if kind == "cpu":
        torch.set_num_threads(1)
    if rank == 0:
        info = facts(kind)
        if args.dump:
            info["parity"] = write_parity_dumps(out, dev)
        _write(out, "facts.json", info)
    if world > 1:
        import torch.distributed as dist

        backend = {"cuda": "nccl", "rocm": "nccl", "musa": "mccl", "cpu": "gloo"}[kind]
        dist.init_process_group(backend=backend)  # pyright: ignore[reportUnknownMemberType]
    sync = _sync_fn(module)
    # Held for the whole run: the window's peak allocation must include it.
    ballast = torch.empty(args.ballast_mib * 1024 * 1024, dtype=torch.uint8, device=dev)
    width = args.width
    model: nn.Module = nn.Sequential(
        nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 16)
    ).to(dev)
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model, device_ids=[local] if module is not None else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    xs = torch.randn(args.batch, width)
    ys = torch.randint(0, 16, (args.batch,))
    if module is not None:
        xs, ys = xs.pin_memory(), ys.pin_memory()
    stamps: list[int] = []
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    meta = {
        "ballast_bytes": ballast.numel(),
        "param_bytes": params,
        "activation_bytes": args.batch * width * 4 * 2 * 3,
        "batch": args.batch,
        "width": width,
    }

    def save() -> None:
        if rank == 0 and args.clock:
            _write(out, args.clock, {"stamps_ns": stamps, **meta})

    sync()
    stamps.append(time.perf_counter_ns())  # the start of step 0
    try:
        for _ in range(args.steps):
            x = xs.to(dev, non_blocking=False)  # one host-to-device copy per step
            y = ys.to(dev, non_blocking=False)
            loss = loss_fn(model(x), y)
            loss.backward()
            try:
                opt.step()  # pyright: ignore[reportUnknownMemberType]
            except WindowComplete:
                # The harness ends the script from inside this step's optimizer hook: stamp it first.
                sync()
                stamps.append(time.perf_counter_ns())
                raise
            sync()
            stamps.append(time.perf_counter_ns())  # as close to the harness's boundary as possible
            opt.zero_grad(set_to_none=True)
    finally:
        save()
        del ballast
    return 0


def matmul(args: argparse.Namespace) -> int:
    import torch

    from perfgate.harness import Window

    out = Path(args.out)
    kind, dev_type, module, why = resolve_device(args.device)
    if why is not None:
        print(f"selftest job: device {args.device!r} unavailable: {why}", file=sys.stderr)
        return EXIT_NO_DEVICE
    dev = torch.device(dev_type, 0) if module is not None else torch.device("cpu")
    if kind == "cpu":
        torch.set_num_threads(1)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    n, reps = args.n, args.reps
    g = torch.Generator().manual_seed(7)
    a = torch.randn(n, n, generator=g).to(dev, dtype)
    b = torch.randn(n, n, generator=g).to(dev, dtype)
    c = torch.empty(n, n, device=dev, dtype=dtype)
    _write(
        out,
        "matmul.json",
        {"n": n, "reps": reps, "dtype": args.dtype, "flops_per_step": 2 * n**3 * reps, "kind": kind},
    )
    window = Window()
    for _ in range(args.steps):
        with window.step():
            for _ in range(reps):
                torch.mm(a, b, out=c)
    window.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = p.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("train")
    t.add_argument("--device", default="auto")
    t.add_argument("--out", required=True)
    t.add_argument("--steps", type=int, required=True)
    t.add_argument("--batch", type=int, default=64)
    t.add_argument("--width", type=int, default=256)
    t.add_argument("--ballast-mib", type=int, default=64)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--dump", action="store_true", help="write facts-side parity dumps (rank 0)")
    t.add_argument("--clock", default=None, help="file name for the synchronized wall-clock stamps")
    m = sub.add_parser("matmul")
    m.add_argument("--device", default="auto")
    m.add_argument("--out", required=True)
    m.add_argument("--steps", type=int, required=True)
    m.add_argument("--n", type=int, required=True)
    m.add_argument("--reps", type=int, required=True)
    m.add_argument("--dtype", choices=["bf16", "fp32"], required=True)
    args = p.parse_args(argv)
    return train(args) if args.mode == "train" else matmul(args)


if __name__ == "__main__":
    sys.exit(main())
