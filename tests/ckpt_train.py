"""A tiny CPU training script that checkpoints with torch.save every few steps and resumes with --resume.

Used by tests/test_checkpoint_resume.py (copied into the workspace as train.py). Its faulty resumes are the
bugs a checkpoint change can bring: --ignore-resume takes the option and starts from scratch anyway;
--fresh-optimizer restores the model but not Adam's moments.
"""

import argparse
import os

import torch

p = argparse.ArgumentParser()
p.add_argument("--iters", type=int, default=24)
p.add_argument("--every", type=int, default=8)
p.add_argument("--shards", type=int, default=1, help="stands for a layout degree; the maths is the same")
p.add_argument("--resume", default=None)
p.add_argument("--ignore-resume", action="store_true")
p.add_argument("--fresh-optimizer", action="store_true")
args = p.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
start = 0
if args.resume and not args.ignore_resume:
    state = torch.load(args.resume)
    model.load_state_dict(state["model"])
    if not args.fresh_optimizer:
        opt.load_state_dict(state["opt"])
    start = state["step"]
os.makedirs("ckpt", exist_ok=True)
for it in range(start, args.iters):
    g = torch.Generator().manual_seed(it)  # the data of step `it`, whoever runs it
    x = torch.randn(32, 16, generator=g)
    y = x[:, :1] * 2 - x[:, 1:2]
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {it} loss {loss.item():.6f}")
    if (it + 1) % args.every == 0:
        torch.save(
            {"model": model.state_dict(), "opt": opt.state_dict(), "step": it + 1}, f"ckpt/step{it + 1}.pt"
        )
