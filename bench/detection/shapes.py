"""The detection bench's traces in the shapes real logs take, each written
the way its trainer or logger writes it (the format string named at each),
with an incident of the kind that shape hides:

  - a JSON-lines logger's train and val lines at one step, a bad batch;
  - Hugging Face Trainer's stdout and stderr in one file, a dict every step
    and a progress bar every 500, a divergence that does not recover;
  - a GPT-2 fine-tune logged every 10 iterations (nanoGPT's line), its loss
    exploding inside the warm-up, from 4.8 to 270;
  - a learning-rate sweep point (modded-nanogpt's step line) diverging at
    step 300, 700 steps before the warm-up ends.

Each maker takes (bin folder, work folder) and returns the file's path, as
backtest.py's makers do. The numbers are seeded: every run writes the same
file.
"""

import json
import math
import os

import numpy as np


def _falling(steps, start, end, scale):
    """A healthy run's loss: from `start` down toward `end` with decay
    length `scale` (steps)."""
    return end + (start - end) * np.exp(-np.asarray(steps, dtype=float) / scale)


def jsonl_train_val(bin_dir, work):
    """3,000 steps, one JSON object per log call as a JSON-lines logger
    writes them (`f.write(json.dumps({"step": step, **metrics}) + "\\n")`):
    a train call every step (train_loss, train/grad_norm, lr) and a val call
    every 250 steps at the same step. A bad batch at step 1,800: the loss 1.2
    nats up and the grad norm 8x for that one step."""
    rng = np.random.default_rng(1800)
    steps = np.arange(1, 3001)
    loss = _falling(steps, 10.8, 3.2, 300) + 0.03 * rng.standard_normal(len(steps))
    grad = (0.6 + 2.0 * np.exp(-steps / 200)) * np.exp(0.1 * rng.standard_normal(len(steps)))
    loss[steps == 1800] += 1.2
    grad[steps == 1800] *= 8
    path = os.path.join(work, "jsonl-train-val.jsonl")
    with open(path, "w") as f:
        for s, lo, g in zip(steps, loss, grad):
            lr = 3e-4 * min(1.0, s / 100)
            f.write(json.dumps({"step": int(s), "train_loss": round(float(lo), 5),
                                "train/grad_norm": round(float(g), 5), "lr": lr}) + "\n")
            if s % 250 == 0:
                f.write(json.dumps({"step": int(s), "val_loss": round(float(lo) + 0.08, 5),
                                    "val_ppl": round(math.exp(float(lo) + 0.08), 3)}) + "\n")
    return path


def hf_sparse_bars(bin_dir, work):
    """4,000 steps of Hugging Face Trainer output captured with `> log 2>&1`
    and logging_steps 1: each log is `str(logs)` through tqdm.write (stdout),
    `{'loss': ..., 'grad_norm': ..., 'learning_rate': ..., 'epoch': ...}`;
    the training bar's `\\r` redraws (stderr) reach the file only every 500
    steps, after that step's dict; an evaluation every 1,000 steps prints
    its own bar and `{'eval_loss': ...}`. From step 2,600 the loss climbs
    1 nat over 100 steps and stays there, the grad norm doubled: a
    divergence that does not recover."""
    rng = np.random.default_rng(2600)
    total = 4000
    steps = np.arange(1, total + 1)
    loss = _falling(steps, 4.2, 2.1, 400) + 0.02 * rng.standard_normal(len(steps))
    grad = 0.9 * np.exp(0.1 * rng.standard_normal(len(steps)))
    rise = np.clip((steps - 2600) / 100.0, 0.0, 1.0)
    loss += 1.0 * rise
    grad *= 1.0 + rise
    path = os.path.join(work, "hf-sparse-bars.log")
    with open(path, "w") as f:
        f.write("{'output_dir': 'out', 'logging_steps': 1, 'eval_steps': 1000}\n")
        for s, lo, g in zip(steps, loss, grad):
            epoch = s / 2000
            f.write(f"{{'loss': {lo:.4f}, 'grad_norm': {g:.4f}, 'learning_rate': 2e-05, "
                    f"'epoch': {epoch:.4g}}}\n")
            if s % 1000 == 0:
                f.write("\r  0%|          | 0/25 [00:00<?, ?it/s]\r 52%|#####2    | 13/25 "
                        "[00:01<00:01, 9.71it/s]\r" + " " * 60 + "\r")
                f.write(f"{{'eval_loss': {lo + 0.05:.4f}, 'eval_runtime': 2.57, "
                        f"'epoch': {epoch:.4g}}}\n")
            if s % 500 == 0:
                f.write(f"\r{100 * s // total:3d}%|{'#' * (10 * s // total):<10}| {s}/{total} "
                        f"[{s // 600:02d}:{s // 10 % 60:02d}<06:40, 9.80it/s]")
    return path


def finetune_warmup(bin_dir, work):
    """A GPT-2 fine-tune printing nanoGPT's line every 10 iterations
    (log_interval 10): `iter {iter_num}: loss {lossf:.4f}, time
    {dt*1000:.2f}ms, mfu {running_mfu*100:.2f}%` (mfu -100.00% until its
    fifth iteration). The loss falls from 5.4 to 4.8 by iteration 100, is
    270 at 110 and stays far up, 31 at 180: the whole run is inside the
    1,000-step warm-up and the log has no grad norm."""
    rng = np.random.default_rng(110)
    path = os.path.join(work, "finetune-warmup.log")
    with open(path, "w") as f:
        for i, it in enumerate(range(0, 401, 10)):
            if it <= 100:
                loss = 5.4 - 0.006 * it + 0.05 * rng.standard_normal()
            elif it == 110:
                loss = 270.0
            else:
                loss = 24.0 + 1500.0 / (it - 60) ** 1.3 + 0.5 * rng.standard_normal()
            mfu = -100.0 if i < 5 else 31.2 + 0.1 * rng.standard_normal()
            f.write(f"iter {it}: loss {loss:.4f}, time {412.5 + rng.standard_normal():.2f}ms, "
                    f"mfu {mfu:.2f}%\n")
    return path


def lr_sweep_diverging(bin_dir, work):
    """One point of a learning-rate sweep, logged every step with
    modded-nanogpt's line `step:{step}/{num_iterations}
    train_loss:{loss:.4f} train_time:{ms:.0f}ms step_avg:{avg:.2f}ms`, 600
    steps: the loss falls from ln(50304) to 4.6 by step 300, then the
    learning rate is too high: it climbs back over 100 steps to about 9.7 and
    stays there, 700 steps before the warm-up ends."""
    rng = np.random.default_rng(300)
    steps = np.arange(1, 601)
    loss = _falling(steps, 10.83, 4.4, 90) + 0.04 * rng.standard_normal(len(steps))
    climb = np.clip((steps - 300) / 100.0, 0.0, 1.0)
    loss = loss * (1 - climb) + (9.7 + 0.1 * rng.standard_normal(len(steps))) * climb
    path = os.path.join(work, "lr-sweep.log")
    with open(path, "w") as f:
        for s, lo in zip(steps, loss):
            f.write(f"step:{s}/600 train_loss:{lo:.4f} train_time:{s * 105}ms "
                    f"step_avg:{105.0 + 0.3 * rng.standard_normal():.2f}ms\n")
    return path
