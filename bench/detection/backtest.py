"""Backtesting against the peers' own code: the same traces through three
detectors, with each trace's expected verdict, and what each one did.

  - trainwatch's rule engine: `twctl replay TRACE -o json`; its actions are
    skip_update, page and halt (record and warn are notes, counted apart);
  - OLMo-core's SkipStepAdamW (ai2-olmo-core, olmo_core/optim/
    skip_step_optimizer.py), as installed, on a dummy parameter: each step its
    latest_loss and latest_grad_norm are set, as OLMo's train module sets
    them, and get_step_factor() read; 0 is a skipped step;
  - Lightning's SpikeDetection callback (lightning.pytorch.callbacks), as
    installed, called as a Trainer calls it after each batch with the loss; a
    TrainingSpikeException is a halt (it writes skip_batches.json and raises).
    After a raise the bench goes on feeding the same object (its state as it
    was before the raising batch): each raise is one more halt. That is the
    kindest reading: a real resume cannot restore the callback, whose
    load_state_dict raises (measured below), and starts it afresh.

The traces (traces.py): the synthetic runs of examples/synthetic
(trainwatch-synth: a benign run and the demo's bad batch, logit drift and
NaN), the chapter's two worked examples (the knots of
tests/core/worked_examples_test.cc), the shapes real logs take that hide an
incident (shapes.py: train and val lines at one step, sparse progress bars,
a fine-tune exploding in its warm-up, a sweep point diverging at step 300),
and the real logs of tests/data (formats/ and realdata/). The peers are fed the loss
and grad norm series that twctl's own readers parse from each trace: twctl
follow streams the trace to a trainwatchd, whose stored steps are read back
(a NaN stays a NaN, a metric the log lacks stays unknown and is not fed).

Each trace has its expected verdict: incidents (an onset step, the last step
a response still counts, the response wanted) and windows where any response
is neither credited nor a false alarm (ambiguous moments of real runs). A
detector's alarms are grouped into episodes (alarms on consecutive records);
an episode that begins in an incident's window with a response that deals
with it (ANSWERS) catches it (steps late: from the onset); one that begins
outside every window is a false alarm.

  backtest.py --bin BUILD/bin [--trace ID ...] [--md FILE] [--json FILE]
      [--no-facts] [--list]

Prints Markdown: one table of traces, one of totals, and what was read from
the peers' code and is measured here on the installed packages: that a
SkipStepOptimizer skip multiplies NaN gradients by 0, which is NaN; how many
steps one NaN in its window makes it skip; that SpikeDetection's state cannot
be loaded back. With $TW_BENCH_JSON (make bench), the totals go there as
figures. Run it with the peers' environment's interpreter
(tests/python/env/peers.txt).
"""

import argparse
import dataclasses
import datetime
import importlib.metadata
import json
import logging
import math
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import warnings
from typing import List

import torch

from traces import DATA, ROOT, TRACES, Incident, Rec, Trace, Window  # noqa: F401

sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

DETECTORS = ("trainwatch", "OLMo-core SkipStepAdamW", "Lightning SpikeDetection")


@dataclasses.dataclass
class Episode:
    first: int  # step
    last: int
    action: str
    alarms: int


@dataclasses.dataclass
class Outcome:
    fed: int = 0                 # records the detector saw
    episodes: List[Episode] = dataclasses.field(default_factory=list)
    notes: int = 0               # trainwatch's record and warn events
    caught: list = dataclasses.field(default_factory=list)   # (Incident, Episode)
    missed: List[Incident] = dataclasses.field(default_factory=list)
    false: List[Episode] = dataclasses.field(default_factory=list)
    short: List[Episode] = dataclasses.field(default_factory=list)  # in a window, not enough
    ambiguous: List[Episode] = dataclasses.field(default_factory=list)


# --------------------------------------------------- the series, as parsed

def parsed_series(twctl, daemon, run, path, args):
    """The trace's steps as twctl's reader makes them: followed into a
    trainwatchd and read back from its database."""
    with open(path, "rb") as f:
        # A long drain: on a loaded machine the daemon's durable acks of a
        # long trace have taken more than follow's default 30 s.
        p = subprocess.run([twctl, "follow", "-", "--run", run, "--server", daemon.address,
                            "--status-interval", "0", "--drain-timeout", "600", *args],
                           stdin=f, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"twctl follow {path}: exit {p.returncode}\n"
                           + p.stdout.decode(errors="replace")[-2000:])
    conn = sqlite3.connect(f"file:{daemon.db}?mode=ro", uri=True, timeout=10)
    try:
        rows = conn.execute("SELECT attempt, step, loss, grad_norm, loss_scale, present "
                            "FROM steps WHERE run_id = ? ORDER BY attempt, step",
                            (run,)).fetchall()
    finally:
        conn.close()
    if any(a != 0 for a, *_ in rows):
        raise RuntimeError(f"{path}: a restart in the log; the bench replays one attempt")

    def value(v, present, bit):  # the store keeps a NaN as NULL, with its bit set
        if v is not None:
            return float(v)
        return math.nan if present & (1 << bit) else None

    return [Rec(s, value(lo, pr, 0), value(g, pr, 1), ls) for _, s, lo, g, ls, pr in rows]


# -------------------------------------------------------------- detectors

def run_trainwatch(twctl, path, args):
    p = subprocess.run([twctl, "replay", path, "-o", "json", *args], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"twctl replay {path}: exit {p.returncode}\n{p.stderr[-2000:]}")
    alarms, notes = [], 0
    for line in p.stdout.splitlines():
        e = json.loads(line)
        short = {"skip_update": "skip", "page": "page", "halt": "halt"}.get(e["action"])
        if short:
            alarms.append((e["step"], short))
        elif e["action"] in ("record", "warn"):
            notes += 1
    return alarms, notes


def fed(series):
    """The records a peer can be given: those with a loss (both peers act on
    the loss; a log without one cannot be fed to them)."""
    return [r for r in series if r.loss is not None]


def skip_step_optimizer():
    from olmo_core.optim.adamw import SkipStepAdamW
    return SkipStepAdamW([torch.nn.Parameter(torch.zeros(4))])


def run_olmo(series):
    """SkipStepAdamW's get_step_factor() per step, fed as OLMo's train module
    feeds it: the loss, and the pre-clip grad norm where the log has one."""
    opt = skip_step_optimizer()
    recs = fed(series)
    with_grad = bool(recs) and all(r.grad_norm is not None for r in recs)
    alarms = []
    for r in recs:
        opt.latest_loss = torch.tensor(r.loss)
        if with_grad:
            opt.latest_grad_norm = torch.tensor(r.grad_norm)
        if opt.get_step_factor().item() == 0.0:
            alarms.append((r.step, "skip"))
    return alarms, len(recs)


def run_lightning(series, work):
    import lightning.pytorch as pl
    from lightning.fabric.utilities.spike import TrainingSpikeException
    from lightning.pytorch.callbacks import SpikeDetection

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # no banner per trace
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=work)
    callback = SpikeDetection(exclude_batches_path=os.path.join(work, "skip_batches.json"))
    recs = fed(series)
    alarms = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchmetrics on each NaN it leaves out of its mean
        for i, r in enumerate(recs):
            try:
                callback.on_train_batch_end(trainer, None, torch.tensor(r.loss), None, i)
            except TrainingSpikeException:
                alarms.append((r.step, "halt"))
    if alarms:  # what it wrote: the batch before each raise and the raising one
        with open(callback.exclude_batches_path) as f:
            assert len(json.load(f)) == 2 * len(alarms)
    return alarms, len(recs)


# ----------------------------------------------------------------- scoring

def episodes(alarms, series):
    index = {r.step: i for i, r in enumerate(series)}
    out = []
    for step, action in sorted(alarms):
        prev = out[-1] if out else None
        if prev and step in index and prev.last in index and index[step] - index[prev.last] <= 1:
            prev.last, prev.alarms = step, prev.alarms + 1
            if action not in prev.action.split("+"):
                prev.action += "+" + action
        else:
            out.append(Episode(step, step, action, 1))
    return out


# The responses that deal with an incident: a bad batch's update must not be
# applied (a halt does that too, at the price of a restart); a drift needs a
# human (a halt brings one); a NaN needs the run stopped: a skipped step does
# not keep a NaN out of the optimizer's state (SkipStepOptimizer's 0 x NaN).
ANSWERS = {"skip": {"skip", "halt"}, "page": {"page", "halt"}, "halt": {"halt"}}


def score(out, incidents, windows):
    for ep in out.episodes:
        inside = [i for i in incidents if i.onset <= ep.first <= i.by]
        hit = next((i for i in inside if set(ep.action.split("+")) & ANSWERS[i.want]
                    and all(c[0] is not i for c in out.caught)), None)
        if hit:
            out.caught.append((hit, ep))
        elif inside:
            out.short.append(ep)
        elif any(w.first <= ep.first <= w.last for w in windows):
            out.ambiguous.append(ep)
        else:
            out.false.append(ep)
    out.missed = [i for i in incidents if all(c[0] is not i for c in out.caught)]
    return out


def episodes_text(eps, shown=3):
    """'skip 1,751, 2,224 and 3 more' when one action, else each with its own."""
    same = len({e.action for e in eps}) == 1
    items = [span(e) if same else f"{e.action} {span(e)}" for e in eps]
    text = ", ".join(items[:shown])
    text += f" and {len(items) - shown} more" if len(items) > shown else ""
    return f"{eps[0].action} {text}" if same else text


def span(ep):
    return f"{ep.first:,}" if ep.first == ep.last else f"{ep.first:,}-{ep.last:,}"


def cell(o):
    if o is None:
        return "not fed (no loss in the log)"
    parts = [f"{ep.action} {span(ep)} (+{ep.first - inc.onset:,})" for inc, ep in o.caught]
    parts += [f"missed: {inc.what}" for inc in o.missed]
    if o.false:
        parts.append(f"**{len(o.false)} false**: {episodes_text(o.false)}")
    for name, eps in (("short of it", o.short), ("ambiguous", o.ambiguous)):
        if eps:
            parts.append(f"{name}: {episodes_text(eps)}")
    if o.notes:
        parts.append(f"{o.notes} note{'s' if o.notes > 1 else ''}")
    return "; ".join(parts) if parts else "nothing"


def expected_text(incidents, windows):
    parts = [f"{i.want} {i.onset:,}" if i.onset == i.by else f"{i.want} {i.onset:,}-{i.by:,}"
             for i in incidents]
    text = "; ".join(f"{p} ({i.what})" for p, i in zip(parts, incidents)) or "nothing"
    if windows:
        text += "; either way: " + "; ".join(
            (f"{w.first:,}" if w.first == w.last else f"{w.first:,}-{w.last:,}") + f" ({w.why})"
            for w in windows)
    return text


# --------------------------------------------------------------- the facts

def skipstep_facts():
    """Two facts read from SkipStepOptimizer's code, measured
    on the installed package: (1) whether a step it skips with NaN gradients
    leaves the parameter and Adam's moments finite; (2) how many steps one
    NaN loss (and, apart, one NaN grad norm) in a steady series makes it
    skip."""
    torch.manual_seed(0)
    opt = skip_step_optimizer()
    p = opt.param_groups[0]["params"][0]
    for _ in range(100):
        opt.latest_loss = torch.tensor(2.0 + 0.01 * torch.randn(()).item())
        opt.latest_grad_norm = torch.tensor(1.0 + 0.01 * torch.randn(()).item())
        p.grad = torch.randn_like(p)
        opt.step()
    finite_before = bool(torch.isfinite(p).all())
    opt.latest_loss = torch.tensor(math.nan)
    opt.latest_grad_norm = torch.tensor(math.nan)
    p.grad = torch.full_like(p, math.nan)
    factor = opt.get_step_factor().item()
    opt.step()
    state = opt.state[p]
    poisoned = {"param": not bool(torch.isfinite(p).all()),
                "exp_avg": not bool(torch.isfinite(state["exp_avg"]).all()),
                "exp_avg_sq": not bool(torch.isfinite(state["exp_avg_sq"]).all())}

    def skipped_after_one_nan(which):
        opt = skip_step_optimizer()
        skipped = []
        for s in range(600):
            loss, grad = 2.0 + 0.01 * math.sin(s), 1.0 + 0.01 * math.cos(s)
            if s == 200:
                loss, grad = (math.nan, grad) if which == "loss" else (loss, math.nan)
            opt.latest_loss, opt.latest_grad_norm = torch.tensor(loss), torch.tensor(grad)
            if opt.get_step_factor().item() == 0.0:
                skipped.append(s)
        contiguous = skipped == list(range(200, 200 + len(skipped)))
        return len(skipped), contiguous

    return {"finite_before": finite_before, "factor_at_nan": factor, "poisoned": poisoned,
            "window": opt.rolling_interval_length,
            "skipped_after_nan_loss": skipped_after_one_nan("loss"),
            "skipped_after_nan_grad_norm": skipped_after_one_nan("grad_norm")}


def lightning_facts():
    """What SpikeDetection.load_state_dict does with its own state_dict():
    None when it loads, else the exception as text."""
    from lightning.pytorch.callbacks import SpikeDetection
    callback = SpikeDetection()
    callback._update_stats(torch.tensor(2.0))  # one batch's loss, as after a first batch
    try:
        SpikeDetection().load_state_dict(callback.state_dict())
        return {"load_state_dict_error": None}
    except Exception as e:  # noqa: BLE001  (whatever it raises is the finding)
        return {"load_state_dict_error": f"{type(e).__name__}: {e}"}


def facts_text(f):
    pois = [k for k, v in f["poisoned"].items() if v]
    n_loss, contiguous_loss = f["skipped_after_nan_loss"]
    n_grad, contiguous_grad = f["skipped_after_nan_grad_norm"]
    return "\n".join([
        "SkipStepOptimizer (SkipStepAdamW, rolling window "
        f"{f['window']}), measured on the installed package:",
        "",
        f"- 0 x NaN: a step with a NaN loss and NaN gradients gets step factor "
        f"{f['factor_at_nan']:g} (skipped), yet after it "
        + (f"{', '.join(pois)} {'is' if len(pois) == 1 else 'are'} NaN: the skip does not "
           "protect the model" if pois else "the parameter and both moments are finite")
        + ".",
        f"- A NaN in the window: one NaN loss in a steady 600-step series makes it skip "
        f"{n_loss} steps{' in a row' if contiguous_loss else ''} (the NaN step and every step "
        f"while the NaN is among the {f['window']} before it); one NaN grad norm, {n_grad}"
        f"{' in a row' if contiguous_grad else ''}.",
        "",
        "SpikeDetection's load_state_dict, given its own state_dict(): "
        + ("loads it." if f["load_state_dict_error"] is None else
           f"`{f['load_state_dict_error']}`: a resumed run cannot restore the callback's "
           "running mean, and starts it afresh."),
    ])


# -------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True, help="folder with twctl, trainwatchd, trainwatch-synth")
    ap.add_argument("--trace", action="append", help="a trace's id (repeatable); default all")
    ap.add_argument("--md", help="also write the Markdown here")
    ap.add_argument("--json", help="write every outcome here as JSON")
    ap.add_argument("--no-facts", action="store_true",
                    help="leave out what is measured on the peers' code")
    ap.add_argument("--list", action="store_true", help="list the traces' ids and exit")
    args = ap.parse_args()
    if args.list:
        for t in TRACES:
            print(f"{t.id}\t{t.label}")
        return 0
    ids = [t.id for t in TRACES]
    for t in args.trace or []:
        if t not in ids:
            sys.exit(f"--trace {t}: no such trace (--list lists them)")
    traces = [t for t in TRACES if not args.trace or t.id in args.trace]
    twctl = os.path.join(args.bin, "twctl")
    os.environ.setdefault("TRAINWATCHD", os.path.join(args.bin, "trainwatchd"))
    from trainwatchd_process import Trainwatchd

    rows, results = [], []
    totals = {d: Outcome() for d in DETECTORS}
    late = {d: [] for d in DETECTORS}
    unfed = {d: 0 for d in DETECTORS}
    daemon = Trainwatchd()
    try:
        with tempfile.TemporaryDirectory(prefix="tw-detection.") as work:
            for t in traces:
                path = t.make(args.bin, work)
                series = parsed_series(twctl, daemon, t.id, path, t.args)
                incidents = t.incidents(series)
                tw_alarms, notes = run_trainwatch(twctl, path, t.args)
                outcomes = {DETECTORS[0]: Outcome(len(series), episodes(tw_alarms, series),
                                                  notes)}
                for name, run in ((DETECTORS[1], run_olmo),
                                  (DETECTORS[2], lambda s: run_lightning(s, work))):
                    alarms, n = run(series)
                    outcomes[name] = Outcome(n, episodes(alarms, fed(series))) if n else None
                for name, o in outcomes.items():
                    if o is None:
                        unfed[name] += 1
                        totals[name].missed += incidents
                        continue
                    score(o, incidents, t.windows)
                    totals[name].caught += o.caught
                    totals[name].missed += o.missed
                    totals[name].false += o.false
                    late[name] += [ep.first - inc.onset for inc, ep in o.caught]
                rows.append(f"| {t.label} | {len(series):,} | {expected_text(incidents, t.windows)}"
                            f" | " + " | ".join(cell(outcomes[d]) for d in DETECTORS) + " |")
                results.append({"trace": t.id, "records": len(series),
                                "expected": [dataclasses.asdict(i) for i in incidents],
                                "windows": [dataclasses.asdict(w) for w in t.windows],
                                "detectors": {d: None if o is None else {
                                    "fed": o.fed, "notes": o.notes,
                                    "caught": [{"what": i.what, "step": ep.first,
                                                "late": ep.first - i.onset, "action": ep.action,
                                                "last": ep.last} for i, ep in o.caught],
                                    "missed": [i.what for i in o.missed],
                                    "false": [dataclasses.asdict(e) for e in o.false],
                                    "short": [dataclasses.asdict(e) for e in o.short],
                                    "ambiguous": [dataclasses.asdict(e) for e in o.ambiguous]}
                                    for d, o in outcomes.items()}})
                print(f"== {t.id}: done", file=sys.stderr, flush=True)
    finally:
        daemon.stop()

    version = importlib.metadata.version
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    expected = sum(len(r["expected"]) for r in results)
    lines = [
        f"Detection backtest, {date} (`make bench`, bench/detection/backtest.py): "
        f"trainwatch's rule engine (`twctl replay`, default thresholds), ai2-olmo-core "
        f"{version('ai2-olmo-core')} and lightning {version('lightning')} on torch "
        f"{version('torch')}, each with its defaults.",
        "",
        "| trace | records | expected | " + " | ".join(DETECTORS) + " |",
        "|---|---|---|" + "---|" * len(DETECTORS),
        *rows,
        "",
        "Each response as `action step (+steps after the onset)`; a run of alarms on "
        "consecutive records is one. *Short of it*: in an incident's window, a response that "
        "does not deal with it (a skip for a drift, which goes on, or for a NaN, which a "
        "skipped step still lets into the optimizer's state). *Ambiguous*: in a window where "
        "any response is neither a catch nor a false alarm. Notes: trainwatch's record and "
        "warn events, which neither act nor page.",
        "",
        "| detector | caught | steps late (median, max) | missed | false alarms | traces it "
        "could not be fed |",
        "|---|---|---|---|---|---|",
    ]
    figures = []
    for d in DETECTORS:
        o, lt = totals[d], late[d]
        lines.append(f"| {d} | {len(o.caught)} of {expected} | "
                     + (f"{statistics.median(lt):,.0f}, {max(lt):,}" if lt else "-")
                     + f" | {len(o.missed)} | {len(o.false)} | {unfed[d]} |")
        for what, value in (("incidents caught", len(o.caught)),
                            ("incidents missed", len(o.missed)), ("false alarms", len(o.false))):
            figures.append({"figure": f"detection, {d}: {what}", "value": value,
                            "baseline": expected if what != "false alarms" else None,
                            "ratio": None, "unit": "incidents" if what != "false alarms"
                            else "episodes", "median": None, "min": None, "max": None})
    if not args.no_facts:
        facts = {**skipstep_facts(), **lightning_facts()}
        lines += ["", facts_text(facts)]
    md = "\n".join(lines) + "\n"
    print(md)
    if args.md:
        with open(args.md, "w") as f:
            f.write(md)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": date, "traces": results,
                       "facts": None if args.no_facts else facts}, f, indent=1)
    if os.environ.get("TW_BENCH_JSON"):
        with open(os.environ["TW_BENCH_JSON"], "w") as f:
            json.dump(figures, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
