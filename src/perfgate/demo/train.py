"""The demo's training job: a small MLP whose DataLoader decodes samples slowly.

Each sample costs ``--decode-ms`` of waiting (I/O-like) decode time, one wait per batch, so with
``--num-workers 0`` the training loop waits on data every step, and with workers the decode overlaps
training (waits need no core, so four workers help on two cores too). Everything else (model, data, order, seed) is identical, so the weights after ``--dump-step``
steps are bit-identical across worker counts: the parity check the demo runs. The dump is taken in the
warm-up, so it never lands in a measured window.

    python train.py --num-workers 0 --dump ref.safetensors --sample-log samples/
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SlowDecode(Dataset[tuple[torch.Tensor, torch.Tensor, int]]):
    """Synthetic samples whose decoding takes ``decode_ms`` each (like JPEG or tokenizer work)."""

    def __init__(self, n: int, decode_ms: float, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 64, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)
        self.decode_s = decode_ms / 1000.0

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        time.sleep(self.decode_s)
        return self.x[i], self.y[i], i

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
        # A batch waits once (like one read of a batch of records): one wake-up per batch, not per
        # sample, so the decode time holds on a loaded machine.
        time.sleep(self.decode_s * len(indices))
        return [(self.x[i], self.y[i], i) for i in indices]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument(
        "--steps", type=int, default=30, help="optimizer steps (one epoch = steps * batch samples)"
    )
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--decode-ms", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--dump", default=None, help="write weights and loss after --dump-step steps (safetensors)"
    )
    p.add_argument(
        "--dump-step",
        type=int,
        default=3,
        help="dump in this step: keep it inside the warm-up, before any window",
    )
    p.add_argument("--sample-log", default=None, help="directory for consumed sample ids (audit_samples)")
    args = p.parse_args()

    # The decode waits (I/O-like), so more workers than cores still overlap it; say nothing about it.
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    torch.manual_seed(args.seed)  # pyright: ignore[reportUnknownMemberType]  # torch's stub is untyped here
    torch.set_num_threads(1)
    data = SlowDecode(args.steps * args.batch, args.decode_ms, args.seed)
    order = torch.Generator().manual_seed(args.seed)
    loader = DataLoader(
        data, batch_size=args.batch, shuffle=True, generator=order, num_workers=args.num_workers
    )
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()
    log = None
    if args.sample_log:
        from perfgate.harness import SampleLog

        # Repeated windows relaunch this script into the same folder: each launch's records carry its
        # launch id, and the audit counts the latest run.
        log = SampleLog(args.sample_log)
    for step, (x, y, ids) in enumerate(loader):
        if log is not None:
            log.record(ids, epoch=0, step=step)
        loss = loss_fn(model(x), y)
        loss.backward()
        if args.dump and step + 1 == args.dump_step:
            from perfgate.harness import dump_tensors

            tensors = {f"weights.{k}": v.detach() for k, v in model.state_dict().items()}
            tensors["loss"] = loss.detach().reshape(1)
            dump_tensors(args.dump, tensors)
        opt.step()  # pyright: ignore[reportUnknownMemberType]  # torch's stub leaves the closure untyped
        opt.zero_grad(set_to_none=True)


if __name__ == "__main__":
    main()
