"""Statistics plus gradient clipping, per step, against clipping alone, for a
CPU model of 150 tensors and 25M parameters (75 Linear layers):

  (a) torch.nn.utils.clip_grad_norm_ alone;
  (b) guard.observe() + guard.clip_grad_norm_ (the attach's clip);
  (c) guard.observe() + torch's clip_grad_norm_ (what a trainer paid before);

and each as a share of a whole training step (forward, backward, SGD step)
with a batch of 8 rows: a small batch, so the share is an upper bound.
The targets: b/a <= 1.1 on Debian's torch 1.13, <= 1.0 on torch 2.x (whose
clip is get_total_norm's foreach norms plus a foreach scale); the figures
name the torch they ran on.

  PYTHONPATH=build/python /usr/bin/python3 bench/agent/clip_overhead.py [--rounds N] [--threads T]
  cmake --build build --target clip_overhead     # the same, with the defaults
  build/pyenv/torch-newest/bin/python bench/agent/clip_overhead.py   # torch 2.x

The variants run in one process on the same gradients, alternating (a, b,
c, a, b, c, ...) so that a neighbour's load on the machine falls on all
three alike; each round restores the gradients first (a copy, not timed).
Reported: the median per variant over the rounds, the spread (the 10th and
90th percentile), and the median of the per-round ratios. max_norm is below
the norm, so every variant really scales. --threads sets torch's intra-op
threads (torch's clip uses them; the statistics kernel is one pass on the
calling thread). About 20 s with the defaults.
"""
import argparse
import json
import os
import statistics
import time

import torch

import trainwatch
import trainwatch.torch as twt

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--rounds", type=int, default=40, help="timed rounds per variant (default 40)")
ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
ap.add_argument("--on-device", action="store_true",
                help="statistics with torch operations (watch(on_device=True)), not the kernels")
args = ap.parse_args()
if args.rounds < 3 or args.threads < 1:
    ap.error("--rounds must be >= 3 and --threads >= 1")
torch.set_num_threads(args.threads)
torch.manual_seed(0)

WIDTH, LAYERS, BATCH = 580, 75, 8
model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
params = list(model.parameters())
with torch.no_grad():
    # Weights of std 1/sqrt(width) keep the activations and gradients near
    # 1 through 75 layers: no denormals, whose slow arithmetic would be what
    # is measured.
    for layer in model:
        layer.weight.normal_(0.0, WIDTH ** -0.5)
opt = torch.optim.SGD(params, lr=1e-3)
agent = trainwatch.Agent(run_id="bench-clip", rank=0, world_size=1)
guard = twt.watch(opt, agent, model=model, on_device=args.on_device)
x = torch.randn(BATCH, WIDTH)


def train_step():
    opt.zero_grad(set_to_none=True)
    model(x).square().mean().backward()
    guard.optimizer.step()  # nothing observed: the plain step


train_step()
saved = [p.grad.clone() for p in params]
norm = float(torch.nn.utils.clip_grad_norm_(params, float("inf")))
MAX_NORM = norm / 2  # every variant scales
n = sum(p.numel() for p in params)


def restore():
    for p, g in zip(params, saved):
        p.grad.copy_(g)


step = 0


def a():
    torch.nn.utils.clip_grad_norm_(params, MAX_NORM)


def b():
    global step
    guard.observe(step, 1.0)
    guard.clip_grad_norm_(MAX_NORM)
    guard.verdict = None  # no optimizer.step() here: the next observe() starts afresh
    step += 1


def c():
    global step
    guard.observe(step, 1.0)
    torch.nn.utils.clip_grad_norm_(params, MAX_NORM)
    guard.verdict = None
    step += 1


STEP_SAMPLES = 4
variants = {"a": a, "b": b, "c": c}
times = {k: [] for k in variants}
steps = []
for r in range(args.rounds + 2):  # the first two rounds warm up
    for k, fn in variants.items():
        restore()
        t = time.perf_counter()
        fn()
        if r >= 2:
            times[k].append(time.perf_counter() - t)
    if r % (args.rounds // STEP_SAMPLES + 1) == 0:  # a few: a step takes seconds here
        t = time.perf_counter()
        train_step()
        steps.append(time.perf_counter() - t)
agent.close()


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


print(f"{len(params)} tensors, {n / 1e6:.1f}M params, {args.threads} thread(s), "
      f"{args.rounds} rounds, statistics by {'torch' if args.on_device else 'the kernels'}")
step_ms = statistics.median(steps) * 1e3
print(f"training step (forward+backward+SGD) {step_ms:.1f} ms")
labels = {"a": "clip_grad_norm_ alone", "b": "observe + guard.clip_grad_norm_",
          "c": "observe + torch clip"}
for k in variants:
    med = statistics.median(times[k]) * 1e3
    print(f"({k}) {labels[k]:32s} {med:7.2f} ms  [p10 {pct(times[k], .1) * 1e3:.2f}, "
          f"p90 {pct(times[k], .9) * 1e3:.2f}]  {med / step_ms:6.1%} of a step")
for k in ("b", "c"):
    ratios = [x / y for x, y in zip(times[k], times["a"])]
    print(f"{k}/a {statistics.median(ratios):.2f}  [p10 {pct(ratios, .1):.2f}, "
          f"p90 {pct(ratios, .9):.2f}]")

# For `make bench` (bench/run_all.py): one JSON object per figure, into the
# file it names, or on stdout.
labels_json = {"b": "observe + guard.clip_grad_norm_", "c": "observe + torch's clip"}
figs = []
for k in ("b", "c"):
    ratios = [x / y for x, y in zip(times[k], times["a"])]
    figs.append({"figure": f"clip, torch {torch.__version__.split('+')[0]}: {labels_json[k]} vs "
                           f"torch's clip alone, {len(params)} tensors, "
                           f"{n / 1e6:.0f}M params, {args.threads} thread(s)",
                 "unit": "ms", "value": statistics.median(times[k]) * 1e3,
                 "baseline": statistics.median(times["a"]) * 1e3,
                 "ratio": statistics.median(ratios), "median": statistics.median(ratios),
                 "min": min(ratios), "max": max(ratios)})
if os.environ.get("TW_BENCH_JSON"):
    with open(os.environ["TW_BENCH_JSON"], "a") as f:
        f.write("".join(json.dumps(x) + "\n" for x in figs))
else:
    for x in figs:
        print(json.dumps(x))
