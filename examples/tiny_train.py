"""A tiny real training run on CPU: an MLP on synthetic data through a DataLoader.

Knobs for perfgate's tests and demos:
  --step-ms X         hold every step to X ms (a workload of known step time)
  --slow-rank R --slow-ms Y   rank R spends Y ms more per step, before its forward pass
  --ddp               wrap the model in DistributedDataParallel (gloo) when WORLD_SIZE > 1
  --log-every N       print "step S loss L step_time_ms T" lines (for log-based timing)
  --sync-loss         all-reduce the loss every step (as scripts do to log a global mean), barrier at the end
  --skip-sync-rank R --skip-sync-step S   rank R skips that all_reduce at step S: the ranks' collectives
                      no longer line up and the job hangs (rank R ends in the final barrier while the others
                      wait in their last all_reduce), a hang for perfgate's diagnosis to find

Run plainly, under the harness, or under torchrun:
  python examples/tiny_train.py --steps 30
  python -m perfgate.harness --warmup-steps 3 --measure-steps 10 -- examples/tiny_train.py
  torchrun --nproc-per-node 2 -m perfgate.harness -- examples/tiny_train.py --ddp --slow-rank 1
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _pace import Pacer


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=40, help="optimizer steps to run")
    p.add_argument("--batch", type=int, default=32, help="microbatch size per rank")
    p.add_argument("--accumulation", type=int, default=1, help="microbatches per optimizer step")
    p.add_argument("--width", type=int, default=64, help="hidden width of the MLP")
    p.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument("--step-ms", type=float, default=0.0, help="pad every step to this many ms")
    p.add_argument("--slow-rank", type=int, default=-1, help="rank that is made slower")
    p.add_argument("--slow-ms", type=float, default=10.0, help="extra ms per step on --slow-rank")
    p.add_argument("--ddp", action="store_true", help="DistributedDataParallel over gloo")
    p.add_argument("--sync-loss", action="store_true", help="all_reduce the loss every step (gloo)")
    p.add_argument("--skip-sync-rank", type=int, default=-1, help="rank that skips one loss all_reduce")
    p.add_argument("--skip-sync-step", type=int, default=-1, help="step at which it skips it")
    p.add_argument("--log-every", type=int, default=0, help="print a step line every N steps")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    distributed = world > 1
    if distributed:
        dist.init_process_group("gloo")
    model: nn.Module = nn.Sequential(
        nn.Linear(32, args.width),
        nn.ReLU(),
        nn.Linear(args.width, args.width),
        nn.ReLU(),
        nn.Linear(args.width, 10),
    )
    if distributed and args.ddp:
        model = nn.parallel.DistributedDataParallel(model)
    n = args.batch * args.accumulation * (args.steps + 1)
    data = TensorDataset(torch.randn(n, 32), torch.randint(0, 10, (n,)))
    loader = DataLoader(
        data, batch_size=args.batch, shuffle=True, num_workers=args.num_workers, drop_last=True
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    pacer = Pacer(args.step_ms)
    batches = iter(loader)
    last = time.perf_counter()
    for step in range(args.steps):
        if rank == args.slow_rank:
            time.sleep(args.slow_ms / 1000.0)
        for _ in range(args.accumulation):
            x, y = next(batches)
            loss = loss_fn(model(x), y) / args.accumulation
            loss.backward()
        if (
            distributed
            and args.sync_loss
            and not (rank == args.skip_sync_rank and step == args.skip_sync_step)
        ):
            dist.all_reduce(loss.detach().clone())
        pacer.wait()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if args.log_every and step % args.log_every == 0:
            now = time.perf_counter()
            print(f"step {step} loss {loss.item():.4f} step_time_ms {(now - last) * 1000:.3f}", flush=True)
            last = now
    if distributed:
        if args.sync_loss:
            dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
