#!/usr/bin/env python3
"""A small byte-level transformer language model, trained on CPU on the
license texts Debian ships (/usr/share/common-licenses), with trainwatch
attached in the few lines a user would write.

The data loader addresses every batch by shard ids (2 KiB slices of the
corpus) and honours the run's quarantine list; checkpoints are saved every
--checkpoint-every steps (the last 10 kept) and reported to the agent.
Failures can be injected to watch trainwatch react:

  --corrupt-at N   batch N is random bytes           -> tier 1: update skipped
  --drift-from N   the output logits grow while z-loss is off -> tier 2: page
  --nan-at N       a NaN in one gradient at step N   -> tier 3: halt
  --z-loss ALPHA   z-loss alpha * (log Z)^2 from the start

A rollback command from the server (after a human approved it) loads the
checkpoint, quarantines the shards and the batches of the steps to skip,
applies z-loss and acknowledges.
"""

import argparse
import glob
import json
import math
import os
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import trainwatch
import trainwatch.torch as twt

SHARD_BYTES = 1024     # the corpus is cut into shards of this many bytes
SHARDS_PER_STEP = 2    # each batch reads from this many consecutive shards


def load_corpus():
    paths = sorted(p for p in glob.glob("/usr/share/common-licenses/*") if os.path.isfile(p))
    data = b"".join(open(p, "rb").read() for p in paths)
    if len(data) < 64 * SHARD_BYTES:
        sys.exit("train_lm: /usr/share/common-licenses holds too little text")
    return torch.tensor(list(data), dtype=torch.long)


def merge_ranges(ranges):
    """Inclusive (first, last) ranges, sorted, overlapping and adjacent ones joined."""
    out = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


class ShardLoader:
    """A stream of shards: shard id k is the (k mod N)-th slice of the corpus
    in epoch k // N, so ids grow with the data seen, as sample indices do in a
    large run, and a range of ids is a range of the stream. Step s reads ids
    SHARDS_PER_STEP*s onwards; quarantined ids are passed over (the stream
    shifts past them), so the batch at a step is a deterministic function of
    the step and the quarantine list."""

    def __init__(self, data, batch, context):
        if batch % SHARDS_PER_STEP:
            sys.exit(f"train_lm: --batch must be a multiple of {SHARDS_PER_STEP}")
        self.data, self.batch, self.context = data, batch, context
        self.shards = len(data) // SHARD_BYTES
        self.quarantine = []

    def shard_ids(self, step):
        ids, k = [], SHARDS_PER_STEP * step
        for a, b in sorted(self.quarantine):      # shift past every range at or before us
            if a <= k:
                k += b - a + 1
        while len(ids) < SHARDS_PER_STEP:
            hit = next(((a, b) for a, b in self.quarantine if a <= k <= b), None)
            if hit is None:
                ids.append(k)
                k += 1
            else:
                k = hit[1] + 1
        return ids

    def served(self, first, last):
        """The shard ids this loader served at steps first..last (inclusive),
        as ranges: what a rollback's skip_steps turns into a quarantine."""
        ids = sorted({k for step in range(first, last + 1) for k in self.shard_ids(step)})
        return merge_ranges([(k, k) for k in ids])

    def get(self, step):
        ids = self.shard_ids(step)
        per = self.batch // SHARDS_PER_STEP
        span = SHARD_BYTES - self.context - 1
        xs, ys = [], []
        for k in ids:
            base = (k % self.shards) * SHARD_BYTES
            for i in range(per):
                off = base + (k // self.shards * 131 + i * (span // per)) % span
                xs.append(self.data[off:off + self.context])
                ys.append(self.data[off + 1:off + self.context + 1])
        return torch.stack(xs), torch.stack(ys), ids


class Model(nn.Module):
    def __init__(self, d=96, layers=2, heads=4, context=64):
        super().__init__()
        self.embed = nn.Embedding(256, d)
        self.pos = nn.Parameter(torch.zeros(context, d))
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 256)
        mask = torch.triu(torch.full((context, context), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask)

    def forward(self, x):
        h = self.embed(x) + self.pos[: x.shape[1]]
        h = self.blocks(h, mask=self.mask[: x.shape[1], : x.shape[1]])
        return self.head(self.norm(h))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=32)
    ap.add_argument("--width", type=int, default=48, help="model width (2 layers, 4 heads)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--checkpoint-every", type=int, default=100)
    ap.add_argument("--checkpoint-dir", default="")
    ap.add_argument("--corrupt-at", type=int, default=-1)
    ap.add_argument("--drift-from", type=int, default=-1)
    ap.add_argument("--drift-rate", type=float, default=0.02)
    ap.add_argument("--nan-at", type=int, default=-1)
    ap.add_argument("--z-loss", type=float, default=0.0)
    ap.add_argument("--rules", default="", help="JSON thresholds for the agent")
    ap.add_argument("--server", default="", help="trainwatchd address (or TRAINWATCH_SERVER)")
    ap.add_argument("--run-id", default="", help="(or TRAINWATCH_RUN_ID)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    data = load_corpus()
    loader = ShardLoader(data, args.batch, args.context)
    model = Model(d=args.width, context=args.context)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    ckpt_dir = args.checkpoint_dir or tempfile.mkdtemp(prefix="train_lm_ckpt_")
    os.makedirs(ckpt_dir, exist_ok=True)
    z_loss = args.z_loss

    # --- trainwatch: the few lines a user writes
    agent = trainwatch.Agent(server=args.server, run_id=args.run_id,
                             rules=json.loads(args.rules) if args.rules else None)
    guard = twt.watch(opt, agent, params=model.named_parameters())
    # ---

    print(f"train_lm: {len(data):,} bytes in {loader.shards} shards, checkpoints in {ckpt_dir}",
          flush=True)
    kept = []
    step = 0
    started = time.time()
    while step < args.steps:
        cmd = agent.poll_command()
        if cmd is not None and cmd["kind"] == "rollback":
            state = torch.load(cmd["checkpoint_uri"].replace("file://", ""))
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            # The batches of the skipped steps as this loader served them
            # (before this quarantine), then everything quarantined so far.
            skipped = loader.served(*cmd["skip_steps"]) if cmd["skip_steps"] else []
            loader.quarantine = merge_ranges(loader.quarantine + skipped +
                                             [tuple(r) for r in cmd["quarantine"]])
            if cmd["z_loss_alpha"] is not None:
                z_loss = cmd["z_loss_alpha"]
            step = state["step"]
            guard.resume_from(step)
            skip_text = (f", skipped the batches of steps {cmd['skip_steps'][0]}.."
                         f"{cmd['skip_steps'][1]}" if cmd["skip_steps"] else "")
            agent.acknowledge(cmd["command_id"], "applied",
                              f"loaded {cmd['checkpoint_uri']}, z-loss {z_loss}{skip_text}", step)
            print(f"train_lm: rollback {cmd['command_id']} to step {step}: quarantined "
                  f"{loader.quarantine}{skip_text}, z-loss alpha {z_loss}", flush=True)
            step += 1
            continue

        x, y, shards = loader.get(step)
        if step == args.corrupt_at:
            x = torch.randint(0, 256, x.shape)
            y = torch.randint(0, 256, y.shape)
        logits = model(x)
        if args.drift_from >= 0 and step >= args.drift_from and z_loss == 0.0:
            logits = logits * min(6.0, 1.0 + args.drift_rate * (step - args.drift_from))
        flat = logits.reshape(-1, 256)
        loss = F.cross_entropy(flat, y.reshape(-1))
        total = loss
        if z_loss > 0:
            total = loss + z_loss * torch.logsumexp(flat, dim=-1).pow(2).mean()
        opt.zero_grad()
        total.backward()
        if step == args.nan_at:
            with torch.no_grad():
                model.head.weight.grad[3, 7] = float("nan")
        v = guard.observe(step, loss, logits=flat, shards=shards)   # grads before clipping
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        try:
            opt.step()                                  # skipped or halted by the agent
        except trainwatch.TrainingHalted as e:
            print(f"train_lm: halted at step {step}: {e}", flush=True)
            agent.close()
            return 3
        if v.decision != "continue" or step % 100 == 0:
            print(f"train_lm: step {step} loss {loss.item():.3f} ratio {v.loss_ema_ratio:.2f} "
                  f"grad_norm {v.grad_norm:.2f} -> {v.decision}"
                  + (f" ({v.rule})" if v.rule else ""), flush=True)
        if step > 0 and step % args.checkpoint_every == 0:
            path = os.path.join(ckpt_dir, f"step-{step:07d}.pt")
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, path)
            agent.report_checkpoint(step, "file://" + path)
            kept.append(path)
            while len(kept) > 10:
                os.remove(kept.pop(0))
        step += 1
    print(f"train_lm: finished {args.steps} steps in {time.time() - started:.0f} s", flush=True)
    agent.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
