"""A plain torch training loop's step time under `trainwatch run`, against the
same loop with trainwatch.torch.watch() and without trainwatch, side by side:

  build/pyenv/torch-newest/bin/python bench/agent/run_overhead.py [--rounds N]

The loop is nanoGPT's shape on the CPU (a GPT of 4 layers, width 128,
vocabulary 2,048, gradient accumulation 2, AdamW, clip_grad_norm_), one
intra-op thread. Each round starts three processes, in an order that rotates
from round to round so that a neighbour's load falls on all three alike:

  plain   the loop as written;
  watch   the loop with watch(): accumulate() per micro-batch (loss, logits),
          observe() before the clip;
  run     `trainwatch run -- python <the loop as written>`.

Each process times its steps after a warm-up and prints the median step
time. No trainwatchd: both agents decide locally (streaming is the agent's
own thread, off the step). Reported, as figures of the bench schema: the
median over rounds of run / plain and of run / watch, with their spread.
Goals (bench/run_all.py): run / plain <= 1.02, run / watch <= 1.0 (within
the noise of a shared machine: the median of the per-round ratios).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

VOCAB, BLOCK, EMBD, LAYERS, BATCH, ACCUM = 2048, 64, 128, 4, 8, 2


def loop(mode, steps, warmup):
    import torch
    import torch.nn as nn
    from torch.nn import functional as F
    from torch.nn.utils import clip_grad_norm_

    torch.set_num_threads(1)
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(EMBD), nn.LayerNorm(EMBD)
            self.attn = nn.MultiheadAttention(EMBD, 4, batch_first=True)
            self.mlp = nn.Sequential(nn.Linear(EMBD, 4 * EMBD), nn.GELU(),
                                     nn.Linear(4 * EMBD, EMBD))

        def forward(self, x):
            h = self.ln_1(x)
            mask = torch.triu(torch.ones(x.size(1), x.size(1), dtype=torch.bool), diagonal=1)
            x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(VOCAB, EMBD), nn.Embedding(BLOCK, EMBD)
            self.h = nn.ModuleList([Block() for _ in range(LAYERS)])
            self.ln_f = nn.LayerNorm(EMBD)
            self.lm_head = nn.Linear(EMBD, VOCAB, bias=False)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.size(1)))
            for block in self.h:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))
            return logits, F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))

    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    guard = None
    if mode == "watch":
        import trainwatch
        import trainwatch.torch as twt
        guard = twt.watch(opt, trainwatch.Agent(run_id="bench-watch"),
                          params=model.named_parameters())
    gen = torch.Generator().manual_seed(1)
    times = []
    for step in range(warmup + steps):
        t0 = time.perf_counter()
        for _ in range(ACCUM):
            start = torch.randint(VOCAB, (BATCH, 1), generator=gen)
            seq = (start + torch.arange(BLOCK + 1)) % VOCAB
            logits, loss = model(seq[:, :-1], seq[:, 1:])
            (loss / ACCUM).backward()
            if guard is not None:
                guard.accumulate(loss, logits=logits)
        if guard is not None:
            guard.observe(step)
        clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step >= warmup:
            times.append(time.perf_counter() - t0)
    print(json.dumps({"mode": mode, "step_s": statistics.median(times)}), flush=True)


def child(mode, steps, warmup):
    """The command of one process of a round."""
    me = [sys.executable, os.path.abspath(__file__), "--child", "--steps", str(steps),
          "--warmup", str(warmup)]
    if mode == "run":
        return [sys.executable, "-m", "trainwatch", "run", "--", *me, "plain"]
    return me + [mode]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("mode", nargs="?", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        loop(args.mode, args.steps, args.warmup)
        return
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for var in ("TRAINWATCH_SERVER", "TRAINWATCH_RUN_ID"):
        env.pop(var, None)
    modes = ["plain", "watch", "run"]
    got = {m: [] for m in modes}
    for r in range(args.rounds):
        for m in modes[r % 3:] + modes[:r % 3]:
            p = subprocess.run(child(m, args.steps, args.warmup), capture_output=True, text=True,
                               env=env, timeout=600)
            if p.returncode != 0:
                sys.stderr.write(p.stdout + p.stderr)
                sys.exit(f"run_overhead: the {m} loop failed ({p.returncode})")
            line = [x for x in p.stdout.splitlines() if x.startswith("{")][-1]
            got[m].append(json.loads(line)["step_s"])
            if m == "run" and "trainwatch: attached:" not in p.stderr:
                sys.exit("run_overhead: the loop under trainwatch run was not attached:\n"
                         + p.stderr[-2000:])
    print(json.dumps({m: got[m] for m in modes}), file=sys.stderr)
    import torch
    for base in ("plain", "watch"):
        ratios = [a / b for a, b in zip(got["run"], got[base])]
        print(json.dumps({
            "figure": f"trainwatch run vs {'the loop without trainwatch' if base == 'plain' else 'the loop with watch()'}"
                      f", nanoGPT-shaped loop on the CPU, torch {torch.__version__.split('+')[0]}",
            "unit": "s/step", "value": statistics.median(got["run"]),
            "baseline": statistics.median(got[base]), "ratio": statistics.median(ratios),
            "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}))


if __name__ == "__main__":
    main()
