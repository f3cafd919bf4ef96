"""Global torch hooks that feed the active window (`perfgate.harness._state.active_window`).

Probes, each installed at most once per process and routed to whichever window is active:

* a global optimizer step post-hook (``torch.optim.optimizer.register_optimizer_step_post_hook``):
  every update of the first optimizer that steps is one step boundary;
* a wrapper around ``_BaseDataLoaderIter.__next__``: the host time the training loop blocked waiting
  for a batch, and the batch size (its batch sampler's, else the leading dimension of the first tensor);
* a wrapper around ``torch.autograd.backward``: host time inside backward, which under data-parallel
  training also holds the wait for the other ranks' gradients; a scalar it is called on is the loss,
  kept as a device tensor (``detach()``, no synchronisation) and read at the window's edge;
* wrappers around ``torch.amp.GradScaler.scale`` / ``step``: the unscaled loss, and scaler steps that
  did not reach the optimizer (an AMP overflow skipped the update);
* wrappers around ``torch.save`` (and ``torch.distributed.checkpoint.save`` / ``async_save``,
  ``safetensors.torch.save_file`` where the script imported them): each call is a checkpoint phase of the
  job (`Window.phase_ran`); one
  written inside a measured window is also named in the record's notes (its time stays in the window: it is
  the script's own work); the file each names, and each file ``torch.load``,
  ``torch.distributed.checkpoint.load`` or ``safetensors.torch.load_file`` reads, is listed with its step
  (`Window.checkpoint_file`): the server aligns a resumed run on the save its load names;
* in a job run (``job=true``), evaluation passes: forwards of a module with trainable parameters under
  ``no_grad`` or ``inference_mode``, outside any other module's forward, timed from the first call's start to
  the last call's end;
* tensor capture at a chosen step (`perfgate.harness.capture`): the optimizer post-hook hands over the
  optimizer, the forward probe the top-level module;
* the samples that reach the model: a global forward pre-hook finds the top-level module (the first
  module with trainable parameters called, with gradients enabled, outside any other module's forward),
  then steps aside for a hook on that module alone, which adds the leading dimension of each call's
  first tensor input (every micro-batch of an accumulated step) to the step. A batch measured without a
  DataLoader; a loss module (no parameters) and evaluation under ``no_grad`` are not counted. Before the
  first window, the same hook digests the first rows of those inputs (the launch's sample stream: the
  data path, whatever micro-batches carried it).
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, cast

from perfgate.harness import _state, capture, computed, saved_state, steps
from perfgate.harness._state import ActiveWindow, active_window

__all__ = ["activate", "batch_size", "deactivate", "install_optimizer_hook", "model_facts", "patch_savers"]

_now = time.perf_counter_ns
_optimizer_handle: Any = None
_data_loader_patched = False
_backward_patched = False
_scaler_patched = False
_forward_probed = False
_forward_probe: list[Any] = []
"""The global discovery hooks while no top-level module is known, then the one module hook."""
_forward_depth = 0
_batch_dim = 0
"""The dimension of the top-level module's first input that holds the batch: 1 once a sequence-first layer
inside it (`_SEQUENCE_FIRST`) saw the batch there (`_watch_layout`)."""
_top_shape: tuple[int, ...] = ()
"""The first input's shape of the top-level forward in progress (read by the layout probe)."""
_device_type = "cpu"
_SEQUENCE_FIRST = ("RNNBase", "MultiheadAttention")
"""torch.nn classes whose ``batch_first=False`` instances take (sequence, batch, ...) inputs; the
Transformer layers hold a MultiheadAttention."""
_eval_start: int | None = None
_autocast_seen: set[str | None] = set()
"""Autocast dtypes already noted on the active window (cleared when another window activates)."""
"""Start of the evaluation forward in progress (a job run only)."""


def activate(window: ActiveWindow, *, data_wait: bool = True, backward: bool = True) -> None:
    """Route the probes to ``window``; installs the DataLoader and backward probes if torch is loaded.

    torch is never imported here: a script that does not use torch gets no probes.
    """
    if active_window() is not window:
        steps.watch()  # a new window: its step source is not known yet
        _autocast_seen.clear()
    _state.activate(window)
    torch = sys.modules.get("torch")
    if torch is None:
        return
    if data_wait:
        _patch_data_loader()
    if backward:
        _patch_backward(torch)
        _patch_grad_scaler(torch)
    patch_savers()
    _probe_forward(torch)


def deactivate(window: ActiveWindow) -> None:
    """Stop routing the probes to ``window`` (they stay installed, idle while no window is active)."""
    _state.deactivate(window)


def install_optimizer_hook() -> None:
    """Count optimizer updates as steps of the active window (imports torch)."""
    global _optimizer_handle
    if _optimizer_handle is not None:
        return
    from torch.optim.optimizer import register_optimizer_step_post_hook

    _optimizer_handle = register_optimizer_step_post_hook(_on_optimizer_step)


def _on_optimizer_step(optimizer: object, args: object, kwargs: object) -> None:
    start = _now()
    steps.update_ran()
    window = active_window()
    if window is None:
        return
    computed.saw_optimizer(optimizer)
    if window.timing == "optimizer":
        window.optimizer_step(optimizer)
        steps.stand_down()  # a torch optimizer delimits steps from here on: the gradient rule has no say
        if window.config.capture_step is not None:
            capture.on_optimizer_step(window, optimizer)
    window.own_ns += _now() - start


def batch_size(batch: object) -> int | None:
    """Leading dimension of the first tensor in a (nested) batch, or ``None`` if there is none."""
    item = _first_tensor(batch)
    shape: Any = getattr(item, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) else None


def _first_tensor(batch: object) -> Any:
    """The first object with a ``shape`` in a (nested) batch: tensors, sequences, mappings; else None."""
    item: Any = batch  # an arbitrary user batch
    for _ in range(8):  # bounded descent into nested containers
        if getattr(item, "shape", None) is not None:
            return item
        if isinstance(item, (list, tuple)):
            seq = cast("Sequence[Any]", item)
            if not seq:
                return None
            item = seq[0]
        elif isinstance(item, dict):
            mapping = cast("Mapping[Any, Any]", item)
            if not mapping:
                return None
            item = next(iter(mapping.values()))
        else:
            return None
    return None


def _loader_batch(it: Any, batch: object) -> int | None:
    """Samples in one batch a DataLoader iterator ``it`` yielded: its batch sampler's ``batch_size`` (the
    remainder for the last batch of an epoch), whatever layout the collate function gave the batch; the
    leading dimension of its first tensor where no batch sampler says."""
    lead = batch_size(batch)
    sampler: Any = getattr(it, "_index_sampler", None)
    size = getattr(sampler, "batch_size", None)
    if not getattr(it, "_auto_collation", False) or not isinstance(size, int) or lead == size:
        return lead
    try:
        batches, total = len(sampler), len(sampler.sampler)
    except (TypeError, AttributeError):  # an iterable dataset: no length, every batch full but its last
        return size
    if getattr(it, "_num_yielded", 0) == batches and not getattr(sampler, "drop_last", True) and total % size:
        return total % size
    return size


def _patch_data_loader() -> None:
    global _data_loader_patched
    if _data_loader_patched:
        return
    from torch.utils.data import dataloader

    base = dataloader._BaseDataLoaderIter  # pyright: ignore[reportPrivateUsage] -- the one class every loader iterator shares
    original = base.__next__

    def timed_next(self: Any) -> Any:
        window = active_window()
        if window is None:
            return original(self)
        entered = _now()
        window.work_starts()  # after the last window: the script ends before its next batch
        start = _now()
        batch = original(self)
        end = _now()
        window.add_data_wait(end - start, _loader_batch(self, batch))
        window.own_ns += start - entered + _now() - end
        return batch

    base.__next__ = timed_next
    _data_loader_patched = True


def _patch_backward(torch: Any) -> None:
    global _backward_patched
    if _backward_patched:
        return
    autograd = torch.autograd
    original = autograd.backward

    def timed_backward(*args: Any, **kwargs: Any) -> Any:
        window = active_window()
        if window is None:
            return original(*args, **kwargs)
        entered = _now()
        tensors = args[0] if args else kwargs.get("tensors")
        finds_steps = window.timing == "optimizer" and steps.watching()
        if finds_steps:
            steps.before_backward(window, tensors)  # first: the loss belongs to the step it starts
        window.add_loss(tensors)
        start = _now()
        try:
            out = original(*args, **kwargs)
        finally:
            end = _now()
            window.add_backward(end - start)
        if finds_steps:
            steps.after_backward(window)
        window.own_ns += start - entered + _now() - end
        return out

    # Tensor.backward looks this attribute up at call time, so loss.backward() is covered too.
    autograd.backward = timed_backward
    _backward_patched = True


_SAVERS = (
    ("torch", "save", "torch.save", 1, "f", "obj"),
    (
        "torch.distributed.checkpoint",
        "save",
        "torch.distributed.checkpoint.save",
        None,
        "checkpoint_id",
        "state_dict",
    ),
    (
        "torch.distributed.checkpoint",
        "async_save",
        "torch.distributed.checkpoint.async_save",
        None,
        "checkpoint_id",
        "state_dict",
    ),
    ("safetensors.torch", "save_file", "safetensors.torch.save_file", 1, "filename", "tensors"),
)
"""Checkpoint writers timed as the job's checkpoint phases: (module, attribute, name in notes, position and
keyword of the file it names, keyword of the object it saves, always its first argument). A module the
script has not imported by its first step is left alone (the harness never imports one)."""
_LOADERS = (
    ("torch", "load", "torch.load", 0, "f", None),
    (
        "torch.distributed.checkpoint",
        "load",
        "torch.distributed.checkpoint.load",
        None,
        "checkpoint_id",
        None,
    ),
    ("safetensors.torch", "load_file", "safetensors.torch.load_file", 0, "filename", None),
)
"""Checkpoint readers whose file is listed (`Window.checkpoint_file`), as `_SAVERS`."""
_saves_patched: set[str] = set()


def patch_savers() -> None:
    """Wrap the checkpoint writers (`_SAVERS`) and readers (`_LOADERS`) of the modules already imported;
    again at the first step boundary, when the script's own imports are done."""
    for wrap, table in ((_noted_save, _SAVERS), (_noted_load, _LOADERS)):
        for module_name, attr, what, position, keyword, saved in table:
            module = sys.modules.get(module_name)
            original = getattr(module, attr, None)
            if what in _saves_patched or not callable(original):
                continue
            setattr(module, attr, wrap(original, what, position, keyword, saved))
            _saves_patched.add(what)


def _named_file(
    args: tuple[Any, ...], kwargs: dict[str, Any], position: int | None, keyword: str
) -> str | None:
    """The absolute path a checkpoint call names (a path, or an open file's name); None when it names none
    (a buffer, a storage writer)."""
    target: Any = kwargs.get(keyword)
    if target is None and position is not None and len(args) > position:
        target = args[position]
    if target is not None and not isinstance(target, (str, os.PathLike)):
        target = getattr(target, "name", None)
    if not isinstance(target, (str, os.PathLike)):
        return None
    try:
        return os.path.abspath(os.fspath(cast("str | os.PathLike[str]", target)))
    except (TypeError, ValueError):
        return None


def _saved_state(args: tuple[Any, ...], kwargs: dict[str, Any], saved: str) -> dict[str, Any] | None:
    """The schema of the object a saver was handed (`perfgate.harness.saved_state`); None: none handed, or it
    could not be read."""
    obj = kwargs[saved] if saved in kwargs else args[0] if args else None
    if obj is None:
        return None
    try:
        return saved_state.state_schema(obj)
    except Exception:  # noqa: BLE001 -- a state_dict() that raises here must not fail the script's save
        return None


def _noted_save(original: Any, what: str, position: int | None, keyword: str, saved: str | None) -> Any:
    def noted_save(*args: Any, **kwargs: Any) -> Any:
        window = active_window()
        if window is None:
            return original(*args, **kwargs)
        window.work_starts()
        start = _now()
        # read before the write (metadata only), inside the checkpoint's own time
        state = _saved_state(args, kwargs, saved) if saved is not None else None
        digest = window.saved_state(state) if state is not None else None
        try:
            return original(*args, **kwargs)
        finally:
            end = _now()
            if window.measuring:
                window.user_work_ran(what, end - start)
            window.phase_ran("checkpoint", start, end)
            if (path := _named_file(args, kwargs, position, keyword)) is not None:
                window.checkpoint_file("save", path, digest)

    return noted_save


def _noted_load(original: Any, what: str, position: int | None, keyword: str, saved: str | None) -> Any:
    del saved  # a loader hands over no state

    def noted_load(*args: Any, **kwargs: Any) -> Any:
        loaded = original(*args, **kwargs)
        window = active_window()
        if window is not None and (path := _named_file(args, kwargs, position, keyword)) is not None:
            window.checkpoint_file("load", path)
        return loaded

    return noted_load


def _patch_grad_scaler(torch: Any) -> None:
    """Route GradScaler's scale (the unscaled loss) and step (skipped updates) to the active window."""
    global _scaler_patched
    if _scaler_patched:
        return
    amp = getattr(torch, "amp", None)
    scaler_cls: Any = getattr(amp, "GradScaler", None) if amp is not None else None
    if scaler_cls is None:
        return
    original_scale = scaler_cls.scale
    original_step = scaler_cls.step

    def scale(self: Any, outputs: Any) -> Any:
        scaled = original_scale(self, outputs)
        window = active_window()
        if window is not None:
            window.note_scaled_loss(self, outputs, scaled)
        return scaled

    def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        steps.update_ran()  # the scaler owns this update, skipped or not
        window = active_window()
        if window is not None:
            window.add_scaler_step(self)
        return original_step(self, optimizer, *args, **kwargs)

    scaler_cls.scale = scale
    scaler_cls.step = step
    _scaler_patched = True


def _probe_forward(torch: Any) -> None:
    """Install the discovery hooks once (see the module docstring)."""
    global _forward_depth, _forward_probed
    if _forward_probed:
        return
    module_api: Any = getattr(getattr(getattr(torch, "nn", None), "modules", None), "module", None)
    register_pre = getattr(module_api, "register_module_forward_pre_hook", None)
    register_post = getattr(module_api, "register_module_forward_hook", None)
    if register_pre is None or register_post is None:
        return
    _forward_depth = 0

    def enter(module: Any, args: tuple[Any, ...]) -> None:
        global _forward_depth
        _forward_depth += 1
        window = active_window()
        if window is not None and window.windows_done:
            # a whole window passed without a training forward (an inference loop, say): stop looking, so
            # the global hooks cost no later window anything
            _remove_probe()
            return
        if _forward_depth != 1 or not _trains(module):
            return
        if not torch.is_grad_enabled():
            if window is not None and window.job:
                _eval_starts()
            return
        # found: count this call, then hand over to a hook on this module alone (the global hooks run for
        # every submodule call, a cost the measured steps should not carry)
        global _device_type
        _device_type = next((p.device.type for p in module.parameters()), "cpu")
        if window is not None:
            window.note_model(model_facts(module))
            _watch_layout(torch, module, args, window)
        _count_forward(module, args)
        _remove_probe()
        _forward_probe.append(module.register_forward_pre_hook(_count_forward))
        if window is not None and window.job:
            _forward_probe.append(module.register_forward_hook(_eval_ends, always_call=True))

    def leave(module: Any, args: Any, output: Any) -> None:
        global _forward_depth
        _forward_depth = max(0, _forward_depth - 1)
        if _forward_depth == 0:
            _eval_ends()

    _forward_probe.append(register_pre(enter))
    _forward_probe.append(register_post(leave, always_call=True))
    _forward_probed = True


def _remove_probe() -> None:
    for handle in _forward_probe:
        handle.remove()
    _forward_probe.clear()


def model_facts(module: Any) -> dict[str, Any]:
    """The top-level training module as a comparison needs it: its class, its parameter counts, and a
    digest of its structure (every parameter's name, shape and dtype). One pass over the parameters' metadata,
    once per process; no tensor data is read."""
    structure = hashlib.blake2b(digest_size=16)
    total = trainable = 0
    by_dtype: dict[str, int] = {}
    for name, p in module.named_parameters():
        n = int(p.numel())
        total += n
        trainable += n if p.requires_grad else 0
        structure.update(f"{name}:{tuple(p.shape)}:{p.dtype}\n".encode())
        dtype = str(p.dtype).removeprefix("torch.")
        by_dtype[dtype] = by_dtype.get(dtype, 0) + n
    cls: type = type(module)  # pyright: ignore[reportUnknownVariableType]  # a torch module of any class
    return {
        "name": f"{cls.__module__}.{cls.__qualname__}"[:200],
        "parameters": total,
        "trainable_parameters": trainable,
        "structure": structure.hexdigest(),
        "param_dtype": max(by_dtype, key=by_dtype.__getitem__) if by_dtype else None,
    }


def _watch_layout(torch: Any, module: Any, args: tuple[Any, ...], window: ActiveWindow) -> None:
    """Find the batch dimension of ``module``'s input: the first sequence-first layer inside it gets a one-shot
    hook that reads its batch (dimension 1 of its input) and says which dimension of the top-level input
    holds that many samples (an input transposed before the layer keeps dimension 0)."""
    nn = torch.nn
    kinds = tuple(k for name in _SEQUENCE_FIRST if isinstance(k := getattr(nn, name, None), type))
    layer = next(
        (m for m in module.modules() if isinstance(m, kinds) and not getattr(m, "batch_first", True)), None
    )
    if layer is None:
        return
    cls: type = type(layer)  # pyright: ignore[reportUnknownVariableType]  # a torch module of any class
    name = f"{cls.__module__}.{cls.__qualname__}"
    handle: list[Any] = []
    if layer is module:  # the model is the layer: its input is this call's, read before it is counted
        global _batch_dim
        shape = tuple(int(d) for d in getattr(_first_tensor(args), "shape", ()))
        if len(shape) >= 3:
            _batch_dim = 1
            window.note_batch_layout(1, name, shape[1])
        return

    def read(_: Any, args: tuple[Any, ...]) -> None:
        global _batch_dim
        for h in handle:
            h.remove()
        item = _first_tensor(args)
        shape = tuple(int(d) for d in getattr(item, "shape", ()))
        top = _top_shape
        if len(shape) < 3 or len(top) < 2:
            return  # unbatched or packed input: the layout cannot be read here
        batch = shape[1]
        if top[1] == batch and top[0] != batch:
            _batch_dim = 1
            window.correct_model_samples(top[0], top[1])
            window.note_batch_layout(1, name, batch)
        elif top[0] == batch:
            window.note_batch_layout(0, name, batch)
        else:
            window.note(
                f"the sequence-first layer {name} saw a batch of {batch}, which is neither of the first two "
                f"dimensions of the model's input {top}: samples are read from dimension 0"
            )

    handle.append(layer.register_forward_pre_hook(read))


def _trains(module: Any) -> bool:
    return any(p.requires_grad for p in module.parameters())


def _count_forward(module: Any, args: tuple[Any, ...]) -> None:
    window = active_window()
    if window is None:
        return
    start = _now()
    try:
        _count_into(window, module, args)
    finally:
        window.own_ns += _now() - start


def _count_into(window: ActiveWindow, module: Any, args: tuple[Any, ...]) -> None:
    """The top-level forward's work, kept short: it runs once per micro-batch inside the measured steps."""
    global _top_shape
    if window.timing == "optimizer" and steps.watching():
        steps.before_forward(window)  # first: this forward belongs to the step it starts
    window.work_starts()  # any forward of the model, evaluation included, is new work
    torch = sys.modules["torch"]
    if not torch.is_grad_enabled():
        if window.job:
            _eval_starts()
        return
    _state.saw_module(module)
    first = args[0] if args else None
    shape: Any = getattr(first, "shape", None)
    if shape is None:
        shape = getattr(_first_tensor(args), "shape", None)
    _top_shape = () if shape is None else tuple(map(int, shape[:2]))
    window.add_model_samples(
        _top_shape[_batch_dim] if len(_top_shape) > _batch_dim else None,
        _top_shape[1] if len(_top_shape) > 1 else None,
    )
    if not window.windows_done:
        dtype = _autocast_dtype(torch)
        if dtype not in _autocast_seen:
            _autocast_seen.add(dtype)
            window.note_autocast(dtype)
    wanted = window.stream_rows_wanted()
    if wanted:
        window.add_stream(*_input_rows(args, wanted))


def _autocast_dtype(torch: Any) -> str | None:
    """The autocast dtype in force for the model's device (None: autocast is off)."""
    try:
        if not torch.is_autocast_enabled(_device_type):
            return None
        return str(torch.get_autocast_dtype(_device_type)).removeprefix("torch.")
    except (TypeError, RuntimeError, AttributeError):  # a torch without per-device autocast queries
        return None


def _eval_starts() -> None:
    global _eval_start
    if _eval_start is None:
        _eval_start = _now()


def _eval_ends(*_: object) -> None:
    """An evaluation forward (if one is in progress) ended: a phase of the job."""
    global _eval_start
    start, _eval_start = _eval_start, None
    if start is not None:
        window = active_window()
        if window is not None:
            end = _now()
            window.phase_ran("eval", start, end)
            window.own_ns += _now() - end


def _input_rows(args: tuple[Any, ...], wanted: int) -> tuple[str, bytes | None, int]:
    """(dtype and per-row shape, bytes, rows) of up to ``wanted`` leading rows of a forward's first tensor
    input, read to the host; bytes None when there is no tensor or it cannot be read."""
    item = _first_tensor(args)
    if item is None or not hasattr(item, "detach") or not len(item.shape):
        return "", None, 0
    torch = sys.modules["torch"]
    try:
        rows = item[:wanted].detach().to("cpu").contiguous()
        data = bytes(rows.reshape(-1).view(torch.uint8).numpy().tobytes())
    except (RuntimeError, TypeError, ValueError):
        return "", None, 0
    return f"{item.dtype}:{tuple(item.shape[1:])}", data, int(rows.shape[0])
