"""Runs a training script with failures injected from outside, the script
itself unedited (runpy):

    inject.py [--bad STEP] [--nan STEP --tensor NAME --nan-rank R] --accum N
              [--snapshot FILE] SCRIPT ARGS...

--bad: on rank 0, the targets of every micro-batch of that optimizer step
  become one token (a corrupted batch), through
  torch.nn.functional.cross_entropy.
--nan: on rank --nan-rank, after that step's last backward, one element of
  the named parameter's gradient (the script's global `model`, unwrapped
  from DDP) becomes NaN.
--snapshot: writes FILE.rankR (FILE with one process) saying which
  parameters and optimizer state tensors (the script's global `optimizer`)
  changed between the start of step BAD and the start of step BAD + 1:
  nothing, when the update was skipped.
Optimizer steps are counted as backward calls / accum.

INJECT_PROBE_WORKERS=DIR (with INJECT_WORKER_CONTEXT=fork|spawn): each
DataLoader worker writes DIR/<pid>.json saying what trainwatch holds in it."""

import argparse
import json
import os
import runpy
import sys

import torch

p = argparse.ArgumentParser()
p.add_argument("--bad", type=int, default=-1)
p.add_argument("--nan", type=int, default=-1)
p.add_argument("--tensor", default="")
p.add_argument("--nan-rank", type=int, default=0)
p.add_argument("--accum", type=int, default=1)
p.add_argument("--snapshot", default="")
p.add_argument("script")
p.add_argument("args", nargs=argparse.REMAINDER)
a = p.parse_args()
rank = int(os.environ.get("RANK", "0"))
calls = {"ce": 0, "backward": 0}
snapshots = []

cross_entropy = torch.nn.functional.cross_entropy


def corrupting_cross_entropy(input, target, *args, **kwargs):
    if torch.is_grad_enabled():
        step = calls["ce"] // a.accum
        calls["ce"] += 1
        if rank == 0 and step == a.bad:
            g = torch.Generator().manual_seed(step)
            token = int(torch.randint(input.size(-1), (1,), generator=g))
            target = torch.full_like(target, token)
    return cross_entropy(input, target, *args, **kwargs)


torch.nn.functional.cross_entropy = corrupting_cross_entropy


def script_state():
    main = sys.modules["__main__"]
    model = getattr(main.model, "module", main.model)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    state = {}
    for i, s in main.optimizer.state_dict()["state"].items():
        for k, v in s.items():
            state[f"{i}.{k}"] = v.clone() if isinstance(v, torch.Tensor) else v
    return params, state


def write_snapshot():
    (p0, s0), (p1, s1) = snapshots
    changed = [n for n in p0 if not torch.equal(p0[n], p1[n])]
    changed += [k for k in s0 if not (torch.equal(s0[k], s1[k]) if isinstance(s0[k], torch.Tensor)
                                      else s0[k] == s1[k])]
    path = a.snapshot + (f".rank{rank}" if "RANK" in os.environ else "")
    with open(path, "w") as f:
        json.dump({"params": len(p0), "state": len(s0), "changed": changed}, f)


backward = torch.Tensor.backward


def poisoning_backward(self, *args, **kwargs):
    i = calls["backward"]
    calls["backward"] += 1
    step, micro = divmod(i, a.accum)
    if a.snapshot and micro == 0 and step in (a.bad, a.bad + 1):
        snapshots.append(script_state())
        if len(snapshots) == 2:
            write_snapshot()
    out = backward(self, *args, **kwargs)
    if rank == a.nan_rank and step == a.nan and micro == a.accum - 1:
        model = sys.modules["__main__"].model
        model = getattr(model, "module", model)
        dict(model.named_parameters())[a.tensor].grad.view(-1)[0] = float("nan")
    return out


torch.Tensor.backward = poisoning_backward

probe = os.environ.get("INJECT_PROBE_WORKERS")
if probe:
    import worker_probe
    os.makedirs(probe, exist_ok=True)
    loader_init = torch.utils.data.DataLoader.__init__

    def probing_init(self, *args, **kwargs):
        kwargs["worker_init_fn"] = worker_probe.probe  # importable: spawn pickles it
        kwargs["multiprocessing_context"] = os.environ.get("INJECT_WORKER_CONTEXT", "fork")
        loader_init(self, *args, **kwargs)
    torch.utils.data.DataLoader.__init__ = probing_init


sys.argv = [a.script] + a.args
runpy.run_path(a.script, run_name="__main__")
