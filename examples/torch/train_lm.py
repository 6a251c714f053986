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
  --outlier-at N   an activation outlier at step N: the final norm's
                   activations get a common offset, and its naive variance
                   (E[x^2] - E[x]^2) cancels to a negative number in bf16
                   (NaN under rsqrt), not in fp32 -> tier 3: halt; after a
                   rollback with --precision norm=fp32 the step passes
  --z-loss ALPHA   z-loss alpha * (log Z)^2 from the start
  --no-agent       train with trainwatch detached: nothing is skipped or
                   halted; one JSON line per step on stdout (step, loss,
                   grad_norm, log_z, nan_frac, lr, z_loss_alpha, shards, and
                   checkpoint where one was saved), which `twctl follow -`
                   and `twctl replay` read; other messages go to stderr.
                   trainwatch need not be installed.

The model trains under CPU bf16 autocast (--autocast off: fp32). A rollback
command from the server (after a human approved it), received while running
or, for a restarted job, at hello before step 0, goes through
trainwatch.rollback.apply_rollback: it loads the checkpoint, applies the
settings (lr scale, per-module precision, z-loss) and acknowledges; the
loader quarantines the shards and the batches of the steps to skip.
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

if "--no-agent" not in sys.argv[1:]:  # a detached job need not have trainwatch installed
    import trainwatch
    import trainwatch.rollback as twr
    import trainwatch.torch as twt

SHARD_BYTES = 1024     # the corpus is cut into shards of this many bytes
SHARDS_PER_STEP = 2    # each batch reads from this many consecutive shards
# --outlier-at's offset: large enough that bf16 (8 significant bits) loses
# the variance of activations of size ~1 to cancellation, small enough that
# fp32 keeps it to a few percent.
OUTLIER_OFFSET = 64.0


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


class NaiveNorm(nn.Module):
    """A projection, then a layer norm computed the naive way: the variance
    as E[x^2] - E[x]^2. Under autocast the projection's output is bf16, and
    so is the arithmetic on it: with a large common offset in the
    activations (`offset`, an outlier), E[x^2] and E[x]^2 agree in their 8
    significant bits and their difference is rounding noise, often
    negative, whose rsqrt is NaN. In fp32 the same input normalizes fine."""

    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.proj = nn.Linear(d, d)
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))
        self.eps = eps
        self.offset = 0.0

    def forward(self, x):
        y = self.proj(x) + self.offset
        mean = y.mean(-1, keepdim=True)
        var = (y * y).mean(-1, keepdim=True) - mean * mean
        return (y - mean) * torch.rsqrt(var + self.eps) * self.weight + self.bias


class Model(nn.Module):
    def __init__(self, d=96, layers=2, heads=4, context=64):
        super().__init__()
        self.embed = nn.Embedding(256, d)
        self.pos = nn.Parameter(torch.zeros(context, d))
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers)
        self.norm = NaiveNorm(d)
        self.head = nn.Linear(d, 256)
        mask = torch.triu(torch.full((context, context), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask)

    def forward(self, x):
        h = self.embed(x) + self.pos[: x.shape[1]]
        h = self.blocks(h, mask=self.mask[: x.shape[1], : x.shape[1]])
        return self.head(self.norm(h))


def finite_or_name(x):
    """x, or "nan"/"inf"/"-inf": JSON has no such numbers, replay's reader
    takes them as strings."""
    return x if math.isfinite(x) else str(x)


def detached_metrics(step, loss, flat, model, opt, z_loss, shards):
    """The step's line when trainwatch is detached: what the agent would
    have measured (log_z the mean logsumexp of the logits, nan_frac the
    nonfinite share of the gradients), for a follower to read."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    nonfinite = sum(int((~torch.isfinite(g)).sum()) for g in grads)
    elements = sum(g.numel() for g in grads)
    log_z = torch.logsumexp(flat.detach(), dim=-1).mean().item()
    return {"step": step, "loss": finite_or_name(loss.item()), "log_z": finite_or_name(log_z),
            "nan_frac": nonfinite / elements, "lr": opt.param_groups[0]["lr"],
            "z_loss_alpha": z_loss, "shards": list(shards)}


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
    ap.add_argument("--outlier-at", type=int, default=-1)
    ap.add_argument("--autocast", choices=("bf16", "off"), default="bf16",
                    help="CPU autocast dtype for the forward pass (default bf16)")
    ap.add_argument("--wait-for-server", type=float, default=10.0, metavar="S",
                    help="at startup, wait up to S seconds for the server's answer to hello\n"
                         "and a pending rollback, so a restarted job loads its checkpoint\n"
                         "before step 0 (0: do not wait; default 10)")
    ap.add_argument("--z-loss", type=float, default=0.0)
    ap.add_argument("--rules", default="", help="JSON thresholds for the agent")
    ap.add_argument("--server", default="", help="trainwatchd address (or TRAINWATCH_SERVER)")
    ap.add_argument("--run-id", default="", help="(or TRAINWATCH_RUN_ID)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-agent", action="store_true",
                    help="trainwatch detached: a JSON line per step on stdout for\n"
                         "`twctl follow -` or `twctl replay`; messages on stderr")
    args = ap.parse_args()
    # Detached, stdout is the metrics log: everything else goes to stderr so
    # that every stdout line parses.
    log = sys.stderr if args.no_agent else sys.stdout
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    data = load_corpus()
    loader = ShardLoader(data, args.batch, args.context)
    model = Model(d=args.width, context=args.context)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    ckpt_dir = args.checkpoint_dir or tempfile.mkdtemp(prefix="train_lm_ckpt_")
    os.makedirs(ckpt_dir, exist_ok=True)
    z_loss = args.z_loss

    def load_checkpoint(uri, model, opt):
        """What apply_rollback calls: restores the model, the optimizer and
        the trainer's own state at the checkpoint (z-loss, the loader's
        quarantine), which a restarted job has not got otherwise; returns the
        checkpoint's step."""
        nonlocal z_loss
        state = torch.load(uri.replace("file://", ""))
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        z_loss = state.get("z_loss", z_loss)
        loader.quarantine = [tuple(r) for r in state.get("quarantine", [])]
        return state["step"]

    # --- trainwatch: the few lines a user writes
    agent = guard = None
    if not args.no_agent:
        agent = trainwatch.Agent(server=args.server, run_id=args.run_id,
                                 rules=json.loads(args.rules) if args.rules else None)
        guard = twt.watch(opt, agent, params=model.named_parameters())
    # ---

    print(f"train_lm: {len(data):,} bytes in {loader.shards} shards, checkpoints in {ckpt_dir}",
          file=log, flush=True)
    if agent is not None and args.server and args.wait_for_server > 0 and not agent.wait_for_server(args.wait_for_server):
        print(f"train_lm: no answer from {args.server} within {args.wait_for_server:g} s; "
              "starting anyway", flush=True)
    kept = []
    step = 0
    started = time.time()
    while step < args.steps:
        cmd = agent.poll_command() if agent is not None else None
        if cmd is not None and cmd.kind == "rollback":
            try:
                done = twr.apply_rollback(cmd, agent, model, opt, load_checkpoint, guard=guard)
            except twr.RollbackFailed as e:
                print(f"train_lm: {e}", flush=True)
                agent.close()
                return 4
            # The batches of the skipped steps as this loader served them
            # (with the checkpoint's quarantine, before this one's).
            skipped = loader.served(*done.skip_steps) if done.skip_steps else []
            loader.quarantine = merge_ranges(loader.quarantine + skipped + done.quarantine)
            if done.z_loss_alpha is not None:
                z_loss = done.z_loss_alpha
            step = done.step
            print(f"train_lm: rollback {cmd.command_id} to step {step}: {done.message}; "
                  f"quarantined {loader.quarantine}", flush=True)
            step += 1
            continue

        x, y, shards = loader.get(step)
        if step == args.corrupt_at:
            x = torch.randint(0, 256, x.shape)
            y = torch.randint(0, 256, y.shape)
        model.norm.offset = OUTLIER_OFFSET if step == args.outlier_at else 0.0
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast == "bf16"):
            logits = model(x).float()
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
        if agent is None:
            line = detached_metrics(step, loss, flat, model, opt, z_loss, shards)
            line["grad_norm"] = finite_or_name(
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item())
            opt.step()
        else:
            v = guard.observe(step, loss, logits=flat, shards=shards)   # grads before clipping
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            try:
                opt.step()                              # skipped or halted by the agent
            except trainwatch.TrainingHalted as e:
                print(f"train_lm: {e}", flush=True)  # one line: step, rule, reason, tensors
                agent.close()
                return 3
        if agent is not None and (v.decision != "continue" or step % 100 == 0):
            print(f"train_lm: step {step} loss {loss.item():.3f} ratio {v.loss_ema_ratio:.2f} "
                  f"grad_norm {v.grad_norm:.2f} -> {v.decision}"
                  + (f" ({v.rule})" if v.rule else ""), flush=True)
        if step > 0 and step % args.checkpoint_every == 0:
            path = os.path.join(ckpt_dir, f"step-{step:07d}.pt")
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                        "z_loss": z_loss, "quarantine": loader.quarantine}, path)
            if agent is not None:
                agent.report_checkpoint(step, "file://" + path)
            else:
                line["checkpoint"] = "file://" + path
            kept.append(path)
            while len(kept) > 10:
                os.remove(kept.pop(0))
        if agent is None:
            print(json.dumps(line), flush=True)
        step += 1
    print(f"train_lm: finished {args.steps} steps in {time.time() - started:.0f} s",
          file=log, flush=True)
    if agent is not None:
        agent.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
