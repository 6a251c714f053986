"""A nanoGPT-style training script, written as users write them, with no
trainwatch in it: a small GPT returning (logits, loss), AdamW, gradient
accumulation with loss / accum, torch.nn.utils.clip_grad_norm_ imported by
name, DDP under torchrun. It prints, for each optimizer step, the step's loss
(the mean over micro-batches and ranks) and the norm its clip returned.

Options: --steps N, --accum N, --no-clip (the norm printed is the script's
own), --fused (AdamW(fused=True)), --scaler (a CPU GradScaler, fp16
autocast; --init-scale its first scale), --loader-workers N (batches from a
DataLoader with N workers).

For bench/agent/run_overhead.py: --size bench (a GPT of 4 layers, width
128, vocabulary 2,048), --time (prints the median step time after 5 warm-up
steps, as JSON: the process's CPU time, which a neighbour's load inflates
less than the wall clock's, and the wall time), --watch (trainwatch attached in the code instead:
trainwatch.torch.watch(), accumulate() per micro-batch, observe() before the
clip)."""

import argparse
import json
import math
import os
import statistics
import time

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.nn.utils import clip_grad_norm_

VOCAB, BLOCK, EMBD, HEADS, LAYERS, BATCH = 32, 16, 32, 2, 2, 8


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(EMBD)
        self.attn = nn.MultiheadAttention(EMBD, HEADS, batch_first=True)
        self.ln_2 = nn.LayerNorm(EMBD)
        self.mlp = nn.Sequential(nn.Linear(EMBD, 4 * EMBD), nn.GELU(), nn.Linear(4 * EMBD, EMBD))

    def forward(self, x):
        h = self.ln_1(x)
        mask = torch.triu(torch.ones(x.size(1), x.size(1), dtype=torch.bool), diagonal=1)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(VOCAB, EMBD), wpe=nn.Embedding(BLOCK, EMBD),
            h=nn.ModuleList([Block() for _ in range(LAYERS)]), ln_f=nn.LayerNorm(EMBD)))
        self.lm_head = nn.Linear(EMBD, VOCAB, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.size(1))
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss


class Sequences(torch.utils.data.Dataset):
    """Counting sequences modulo VOCAB from a random start: learnable."""

    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        start = torch.randint(VOCAB, (1,), generator=g)
        seq = (start + torch.arange(BLOCK + 1)) % VOCAB
        return {"x": seq[:-1], "y": seq[1:]}



if __name__ == "__main__":  # DataLoader workers may spawn
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--no-clip", action="store_true")
    p.add_argument("--fused", action="store_true")
    p.add_argument("--scaler", action="store_true")
    p.add_argument("--init-scale", type=float, default=2.0 ** 10)
    p.add_argument("--loader-workers", type=int, default=-1)
    p.add_argument("--size", choices=("test", "bench"), default="test")
    p.add_argument("--time", action="store_true")
    p.add_argument("--watch", action="store_true")
    args = p.parse_args()
    if args.size == "bench":
        VOCAB, BLOCK, EMBD, HEADS, LAYERS = 2048, 64, 128, 4, 4

    ddp = int(os.environ.get("RANK", -1)) != -1
    if ddp:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        rank = dist.get_rank()
    else:
        rank = 0
    master = rank == 0
    torch.manual_seed(1337)

    gen = torch.Generator().manual_seed(100 + rank)


    def get_batch():
        start = torch.randint(VOCAB, (BATCH, 1), generator=gen)
        seq = (start + torch.arange(BLOCK + 1)) % VOCAB
        return seq[:, :-1], seq[:, 1:]


    model = GPT()
    if ddp:
        model = DDP(model)
    raw = model.module if ddp else model
    optimizer = torch.optim.AdamW(raw.parameters(), lr=3e-3, weight_decay=0.1,
                                  **({"fused": True} if args.fused else {}))
    scaler = torch.amp.GradScaler("cpu", init_scale=args.init_scale) if args.scaler else None
    guard = None
    if args.watch:
        import trainwatch
        import trainwatch.torch
        guard = trainwatch.torch.watch(optimizer, trainwatch.Agent(),
                                       params=raw.named_parameters())

    batches = None
    if args.loader_workers >= 0:
        loader = torch.utils.data.DataLoader(Sequences(), batch_size=BATCH,
                                             num_workers=args.loader_workers,
                                             sampler=torch.utils.data.RandomSampler(
                                                 Sequences(), generator=gen))
        batches = iter(loader)

    times = []
    for step in range(args.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        total = 0.0
        for micro in range(args.accum):
            if batches is not None:
                b = next(batches)
                x, y = b["x"], b["y"]
            else:
                x, y = get_batch()
            if scaler is not None:
                with torch.autocast("cpu", dtype=torch.float16):
                    logits, loss = model(x, y)
            else:
                logits, loss = model(x, y)
            if guard is not None:
                guard.accumulate(loss, logits=logits)
            loss = loss / args.accum
            total += loss.item()
            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                loss.backward()
        if scaler is not None:
            scaler.unscale_(optimizer)
        if guard is not None:
            guard.observe(step)
        if args.no_clip:
            norm = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in raw.parameters()
                                 if p.grad is not None))
        else:
            norm = float(clip_grad_norm_(model.parameters(), 1.0))
        if ddp:
            t = torch.tensor([total], dtype=torch.float64)
            dist.all_reduce(t)
            total = float(t) / dist.get_world_size()
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step >= 5:
            times.append((time.process_time() - c0, time.perf_counter() - t0))
        if master:
            print(f"step {step} loss {total:.9g} norm {norm:.9g}", flush=True)

    if args.time and master:
        print(json.dumps({"cpu_s": statistics.median(c for c, _ in times),
                          "wall_s": statistics.median(w for _, w in times)}), flush=True)
    if master:
        print("finished", flush=True)
    if ddp:
        dist.destroy_process_group()
