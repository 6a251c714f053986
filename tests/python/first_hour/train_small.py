"""A new user's first training script, as they write one: a tiny language
model, AdamW, gradient clipping, and its own print format, with no trainwatch
import. The task is learnable (the next token is the current one plus one),
so the loss falls fast; each step prints

    [HH:MM:SS] step     S/N | loss L | gnorm G | lr LR | T s

--bad-step S: a third of the batch of step S has random targets (a bad batch:
    the loss and the gradient norm jump for that one step);
--nan-step S: from step S on the loss is NaN (a numerical failure).
"""

import argparse
import math
import sys
import time

import torch
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=400)
p.add_argument("--bad-step", type=int, default=-1)
p.add_argument("--nan-step", type=int, default=-1)
a = p.parse_args()

torch.manual_seed(0)
VOCAB, DIM, SEQ, BATCH = 64, 32, 16, 16
model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, DIM), torch.nn.Linear(DIM, DIM),
                            torch.nn.GELU(), torch.nn.Linear(DIM, VOCAB))
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
start = time.monotonic()
for step in range(a.steps):
    x = torch.randint(0, VOCAB, (BATCH, SEQ))
    y = (x + 1) % VOCAB
    if step == a.bad_step:  # a third of the batch mislabelled
        y = torch.where(torch.arange(BATCH)[:, None] < BATCH // 3,
                        torch.randint(0, VOCAB, (BATCH, SEQ)), y)
    logits = model(x)
    loss = F.cross_entropy(logits.view(-1, VOCAB), y.view(-1))
    if a.nan_step >= 0 and step >= a.nan_step:
        loss = loss * math.nan
    opt.zero_grad()
    loss.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    print(f"[{time.strftime('%H:%M:%S')}] step {step:5d}/{a.steps} | loss {loss.item():.4f} | "
          f"gnorm {gnorm.item():.3f} | lr {opt.param_groups[0]['lr']:.1e} | "
          f"{time.monotonic() - start:.1f}s", flush=True)
print("done", file=sys.stderr)
