"""The detection bench's traces and what each should raise: the synthetic
runs of examples/synthetic (trainwatch-synth), the chapter's worked
examples, the shapes real logs take (shapes.py), and the real logs of
tests/data, each with its expected incidents and the windows where any
response is neither a catch nor a false alarm. backtest.py runs them.
"""

import dataclasses
import math
import os
import subprocess
from typing import Callable, List, Optional

import numpy as np

import shapes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data")


@dataclasses.dataclass
class Rec:
    """One step as twctl's reader parsed it; None: the log does not say."""
    step: int
    loss: Optional[float]
    grad_norm: Optional[float]
    loss_scale: Optional[float]


@dataclasses.dataclass
class Incident:
    what: str
    onset: int
    by: int    # the last step at which a response still catches it
    want: str  # skip, page or halt


@dataclasses.dataclass
class Window:
    """Steps where any response is neither a catch nor a false alarm."""
    first: int
    last: int
    why: str


@dataclasses.dataclass
class Trace:
    id: str
    label: str
    make: Callable[[str, str], str]  # (bin, work folder) -> path
    incidents: Callable[[List[Rec]], List[Incident]]
    windows: List[Window] = dataclasses.field(default_factory=list)
    args: List[str] = dataclasses.field(default_factory=list)  # for replay and follow alike


# ---------------------------------------------------------------- the traces

def synth(*args):
    def make(bin_dir, work):
        path = os.path.join(work, "synth" + "".join(a.replace("-", "_") for a in args) + ".csv")
        subprocess.run([os.path.join(bin_dir, "trainwatch-synth"), *args, "--out", path],
                       check=True)
        return path
    return make


def data(*parts):
    return lambda bin_dir, work: os.path.join(DATA, *parts)


def chapter(bin_dir, work):
    """The chapter's worked examples (5.2.2, a 13B model from step 30,000 to
    58,600) with the knots and noise of tests/core/worked_examples_test.cc:
    scenario 1, a bad batch at 42,100 (loss 2.41 -> 2.89, grad norm 7.3 against
    a median of 1.1, back over 400 steps); scenario 2, log_z accelerating from
    57,000 (8.1 -> 15.2 at 58,500), the loss following from 58,200."""
    loss_knots = [(30000, 2.45), (42099, 2.41), (42100, 2.89), (42233, 2.72), (42366, 2.58),
                  (42500, 2.44), (42600, 2.405), (58200, 2.38), (58300, 2.65), (58400, 2.99),
                  (58500, 3.41), (58600, 3.88)]
    log_z_knots = [(30000, 8.3), (45000, 8.3), (57000, 8.1), (57500, 9.6), (58000, 11.9),
                   (58500, 15.2), (58600, 15.9)]
    steps = np.arange(30000, 58601)
    interp = lambda knots: np.interp(steps, [k[0] for k in knots], [k[1] for k in knots])
    rng = np.random.default_rng(58500)
    loss = interp(loss_knots) + 0.02 * rng.standard_normal(len(steps))
    grad = 1.1 * np.exp(0.1 * rng.standard_normal(len(steps)))
    grad[steps == 42100] = 7.3
    late = steps >= 58000
    grad[late] = 2.2 + 0.4 * rng.uniform(-1, 1, late.sum())
    log_z = interp(log_z_knots) + 0.2 * rng.uniform(-1, 1, len(steps))
    path = os.path.join(work, "chapter.csv")
    with open(path, "w") as f:
        f.write("step,loss,grad_norm,log_z,nan_frac,shard,checkpoint\n")
        for s, lo, g, z in zip(steps, loss, grad, log_z):
            ckpt = f"ckpt://test/{s}" if s % 1000 == 0 else ""
            f.write(f"{s},{lo:.6g},{g:.6g},{z:.6g},0,{1000000 + s},{ckpt}\n")
    return path


def first_nonfinite(series, what):
    """A halt from the first nonfinite record on; late while it lasts."""
    bad = [any(v is not None and not math.isfinite(v) for v in (r.loss, r.grad_norm))
           for r in series]
    if True not in bad:
        raise ValueError(f"{what}: no nonfinite record in the trace")
    first = bad.index(True)
    last = first
    while last + 1 < len(series) and bad[last + 1]:
        last += 1
    return [Incident(what, series[first].step, series[last].step, "halt")]


def at_minimum_scale(series):
    for r in series:
        if r.loss_scale == 0.0:
            return [Incident("loss scale at its minimum: the run exits", r.step, r.step, "halt")]
    raise ValueError("no record at the loss scale's minimum")


def none(series):
    return []


# The expected verdicts: the synthetic failures as examples/synthetic/
# synthetic.cc injects them, the chapter's own diagnoses, and what the READMEs
# of tests/data/formats and tests/data/realdata say happens in each log.
TRACES = [
    Trace("synth-benign", "synthetic benign run, 24,000 steps (trainwatch-synth)",
          synth("--steps", "24000"), none),
    Trace("synth-demo", "synthetic demo run, 18,000 steps (trainwatch-synth --demo)",
          synth("--demo"), lambda s: [
              Incident("bad batch", 6000, 6000, "skip"),
              # log_z +8 over 2,000 steps; the loss diverges from 12,600.
              Incident("logit drift", 11000, 13000, "page"),
              Incident("NaN", 16000, 17999, "halt")]),  # NaN to the end
    Trace("chapter", "the chapter's worked examples, steps 30,000-58,600", chapter, lambda s: [
        Incident("bad batch (scenario 1)", 42100, 42100, "skip"),
        Incident("logit drift (scenario 2)", 57000, 58500, "page")]),
    Trace("jsonl-train-val", "JSON lines, train and val lines at one step, a bad batch at "
          "1,800 while the loss still falls (shapes.py)", shapes.jsonl_train_val,
          lambda s: [Incident("bad batch", 1800, 1800, "skip")]),
    Trace("hf-sparse-bars", "HF Trainer stdout+stderr, a dict every step and a bar every 500, "
          "divergence from 2,600 (shapes.py)", shapes.hf_sparse_bars,
          lambda s: [Incident("divergence, not recovering", 2600, 3300, "page")]),
    Trace("finetune-warmup", "GPT-2 fine-tune every 10 iterations, loss 4.8 -> 270 at 110 in "
          "the warm-up (shapes.py)", shapes.finetune_warmup,
          lambda s: [Incident("loss explosion", 110, 200, "page")]),
    Trace("finetune-warmup-vocab", "the same with its vocabulary known (--vocab 50257)",
          shapes.finetune_warmup, lambda s: [Incident("loss explosion", 110, 200, "halt")],
          args=["--vocab", "50257"]),
    Trace("lr-sweep", "learning-rate sweep point, every step, diverging at 300 in the warm-up "
          "(shapes.py)", shapes.lr_sweep_diverging,
          lambda s: [Incident("divergence, not recovering", 300, 500, "page")]),
    Trace("nanogpt-fp16-nan", "nanoGPT fp16, loss NaN from iter 3010 (formats/)",
          data("formats", "nanogpt-fp16-nan.log"), lambda s: first_nonfinite(s, "NaN loss")),
    Trace("nanogpt-shakespeare", "nanoGPT Shakespeare, iters 0-240 (formats/, --vocab 65)",
          data("formats", "nanogpt-shakespeare.log"), none, args=["--vocab", "65"]),
    Trace("megatron-silent-nan", "Megatron-DeepSpeed bf16, grad norm NaN, no lm loss (formats/)",
          data("formats", "megatron-deepspeed-silent-nan.log"),
          lambda s: first_nonfinite(s, "NaN grad norm")),
    Trace("deepspeed-startup", "DeepSpeed fp16 start-up overflows (formats/)",
          data("formats", "deepspeed-startup-overflows.log"), none),
    Trace("hf-deepspeed-min-scale", "HF Trainer + DeepSpeed fp16, scale down to its minimum "
          "(formats/)", data("formats", "hf-deepspeed-min-scale.log"), at_minimum_scale),
    Trace("hf-modernbert-nan", "HF Trainer dict lines, grad norm NaN, loss finite (formats/, "
          "--logging-steps 1)", data("formats", "hf-modernbert-grad-norm-nan.log"),
          lambda s: first_nonfinite(s, "NaN grad norm"), args=["--logging-steps", "1"]),
    Trace("torchtitan-rank0", "torchtitan, steps 14-21 (formats/)",
          data("formats", "torchtitan-rank0.log"), none),
    Trace("torchtitan-every-rank", "torchtitan, a line per rank, steps 4-5 (formats/)",
          data("formats", "torchtitan-every-rank.log"), none),
    Trace("torchtitan-older", "torchtitan's older line, steps 200-250, no grad norm (formats/)",
          data("formats", "torchtitan-older-no-grad-norm.log"), none),
    Trace("nemo1-bar", "NeMo 1 progress bar, one step (formats/)",
          data("formats", "nemo1-progress-bar.log"), none),
    Trace("nemo1-nan", "NeMo 1 progress bar, loss NaN at global step 9,000 (formats/)",
          data("formats", "nemo1-nan-progress-bar.log"), lambda s: first_nonfinite(s, "NaN loss")),
    Trace("nemo2", "NeMo 2 training-epoch lines, iterations 120-125 (formats/)",
          data("formats", "nemo2-training-epoch.log"), none),
    # Left out: composer-llm-shearing-header.log (its loss lines are cut off in
    # the post: nothing to replay) and the *-from-source files, which are not
    # real runs' logs.
    Trace("llmc-gpt2", "llm.c GPT-2 124M, 19,552 steps (realdata/, --vocab 50257)",
          data("realdata", "llmc-gpt2-124m.main.log"), none,
          [Window(8715, 8715, "grad norm 15x its median, loss +0.08")],
          args=["--vocab", "50257"]),
    Trace("modded-nanogpt", "modded-nanogpt 1.5B, 20,344 steps (realdata/, --vocab 50304)",
          data("realdata", "modded-nanogpt-1p5b.log"), none,
          [Window(2730, 2740, "a +0.36 bump while validation loss falls")],
          args=["--vocab", "50304"]),
    Trace("bitnet", "parameter-golf BitNet, 10,000 steps (realdata/, --vocab 1024)",
          data("realdata", "parameter-golf-bitnet.train.log"), none,
          [Window(1132, 1143, "a real transient spike, recovered by itself")],
          args=["--vocab", "1024"]),
    Trace("behemoth", "parameter-golf Behemoth, every 50 steps (realdata/, --vocab 1024)",
          data("realdata", "parameter-golf-behemoth-v10.log"),
          lambda s: first_nonfinite(s, "NaN loss"),
          [Window(850, 850, "a bump, 3.37 against about 3.0")], args=["--vocab", "1024"]),
]
