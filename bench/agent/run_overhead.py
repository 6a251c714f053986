"""A plain torch training loop's step time under `trainwatch run`, against the
same loop with trainwatch.torch.watch() and without trainwatch, side by side:

  build/pyenv/torch-newest/bin/python bench/agent/run_overhead.py [--rounds N]

The loop is tests/python/zero_code/nanogpt_train.py, the script trainwatch
run's tests run, at its bench size (a GPT of 4 layers, width 128, vocabulary
2,048; gradient accumulation 2, AdamW, clip_grad_norm_) on the CPU, one
intra-op thread. Each round starts three processes, in an order that rotates
from round to round so that a neighbour's load falls on all three alike:

  plain   the loop as written;
  watch   the loop with watch() (its --watch): accumulate() per micro-batch
          (loss, logits), observe() before the clip;
  run     `trainwatch run -- python <the loop as written>`.

Each process times its steps after a warm-up and prints the median step
time, in CPU time (user + sys of the process: on a shared machine a
neighbour's load inflates it far less than the wall clock) and in wall time,
which the log keeps. No trainwatchd: both agents decide locally (streaming is the agent's
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

# The loop: the nanoGPT-style script trainwatch run's tests run, at its bench size.
LOOP = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                    "tests", "python", "zero_code", "nanogpt_train.py")


def child(mode, steps):
    """The command of one process of a round."""
    loop = [sys.executable, LOOP, "--size", "bench", "--accum", "2", "--steps", str(steps + 5),
            "--time"]
    if mode == "run":
        return [sys.executable, "-m", "trainwatch", "run", "--", *loop]
    return loop + (["--watch"] if mode == "watch" else [])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=30, help="timed steps, after 5 of warm-up")
    args = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for var in ("TRAINWATCH_SERVER", "TRAINWATCH_RUN_ID"):
        env.pop(var, None)
    modes = ["plain", "watch", "run"]
    got = {m: [] for m in modes}
    wall = {m: [] for m in modes}
    for r in range(args.rounds):
        for m in modes[r % 3:] + modes[:r % 3]:
            p = subprocess.run(child(m, args.steps), capture_output=True, text=True, env=env,
                               timeout=600)
            if p.returncode != 0:
                sys.stderr.write(p.stdout + p.stderr)
                sys.exit(f"run_overhead: the {m} loop failed ({p.returncode})")
            line = [x for x in p.stdout.splitlines() if x.startswith("{")][-1]
            rec = json.loads(line)
            got[m].append(rec["cpu_s"])
            wall[m].append(rec["wall_s"])
            if m == "run" and "trainwatch: attached:" not in p.stderr:
                sys.exit("run_overhead: the loop under trainwatch run was not attached:\n"
                         + p.stderr[-2000:])
    print(json.dumps({"cpu_s": got, "wall_s": wall}), file=sys.stderr)
    import torch
    version = torch.__version__.split("+")[0]
    for base, what in (("plain", "the loop without trainwatch"), ("watch", "the loop with watch()")):
        ratios = [a / b for a, b in zip(got["run"], got[base])]
        print(json.dumps({
            "figure": f"trainwatch run vs {what}, nanoGPT-shaped loop on the CPU, torch {version}",
            "unit": "CPU s/step", "value": statistics.median(got["run"]),
            "baseline": statistics.median(got[base]), "ratio": statistics.median(ratios),
            "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}))


if __name__ == "__main__":
    main()
