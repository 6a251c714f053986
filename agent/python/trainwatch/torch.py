"""Attach trainwatch to a PyTorch training loop.

torch 1.13 has no optimizer step hooks, so watch() wraps the optimizer's own
step(): after backward(), call observe() with the step's loss (and, when you
have them, the logits and the batch's shard ids or names); the next optimizer.step()
then runs, is skipped (tier 1: a data anomaly's update never reaches the
weights or Adam's moments), or raises TrainingHalted (tier 3)::

    guard = trainwatch.torch.watch(optimizer, agent)
    for step, (x, y, shard_ids) in enumerate(loader):
        logits = model(x)
        loss = loss_fn(logits, y)
        optimizer.zero_grad()
        loss.backward()
        guard.observe(step, loss, logits=logits, shards=shard_ids)
        optimizer.step()          # skipped or halted as the agent decides

Host tensors are read in place by the package's statistics kernels. Tensors
on a GPU (or anywhere else) are reduced there with torch's own operations
(grad_stats() and log_z_stats()), and only a few numbers cross to the host.

fp16 with dynamic loss scaling: pass the GradScaler, and call observe()
after backward() and before scaler.step()::

    guard = trainwatch.torch.watch(optimizer, agent, scaler=scaler)
    ...
        scaler.scale(loss).backward()
        guard.observe(step, loss)  # unscales the gradients, once
        scaler.step(optimizer)     # does not unscale again; skips on overflow
        scaler.update()

The statistics are of the unscaled gradients: observe() calls
scaler.unscale_(optimizer) unless the trainer already did this step (to clip,
say), and GradScaler, which allows one unscale_ per step, then does not
unscale again in step(). The record carries scaler.get_scale() and whether the
scaler found inf (its found_inf per device): an overflow step is a tier 0
record, not a halt (core/include/trainwatch/core/config.h, loss_scale_*).
"""

import math as _math

import torch as _torch

from . import TrainingHalted

__all__ = ["watch", "Guard", "distributed_reduce", "grad_stats", "log_z_stats"]


def grad_stats(grads, names=None):
    """Gradient statistics with torch operations, on the tensors' own device.

    Returns (sum of squares over finite elements, nonfinite count, elements,
    per_tensor), per_tensor being None in a healthy step and otherwise a list
    of (name, sum of squares, nonfinite, elements). A healthy step costs one
    fused norm over all tensors and one host sync; the exact per-tensor count
    (in float64) runs only when the fused norm is not finite, which a NaN, an
    inf or a square beyond float range makes it.
    """
    pairs = [(n, g) for n, g in zip(names or [None] * len(grads), grads) if g is not None]
    elements = sum(g.numel() for _, g in pairs)
    if not pairs:
        return 0.0, 0, 0, None
    norms = _torch._foreach_norm([g for _, g in pairs])
    total = float(_torch.stack([n.double() for n in norms]).pow(2).sum())
    if _math.isfinite(total):
        return total, 0, elements, None
    per_tensor, total, nonfinite = [], 0.0, 0
    for i, (name, g) in enumerate(pairs):
        finite = _torch.isfinite(g)
        bad = int(finite.numel() - finite.sum())
        ss = float(_torch.where(finite, g, _torch.zeros((), dtype=g.dtype, device=g.device))
                   .double().pow(2).sum())
        total += ss
        nonfinite += bad
        per_tensor.append((name if name is not None else f"tensor{i}", ss, bad, g.numel()))
    return total, nonfinite, elements, per_tensor


def log_z_stats(logits, labels=None, ignore_index=-100):
    """Mean log partition function over the rows of [..., vocab] logits (rows
    whose label is ignore_index left out), computed on the logits' device in
    float32; NaN when any counted row's log Z is not finite."""
    lz = _torch.logsumexp(logits.reshape(-1, logits.shape[-1]).float(), dim=-1)
    if labels is not None:
        lz = lz[labels.reshape(-1).to(lz.device) != ignore_index]
    if lz.numel() == 0:
        return None
    mean = float(lz.mean())
    return mean if _math.isfinite(mean) else _math.nan


class Guard:
    """Holds the latest verdict and gates the wrapped optimizer's step()."""

    def __init__(self, optimizer, agent, params=None, on_device=False, scaler=None):
        self.optimizer = optimizer
        self.agent = agent
        self.scaler = scaler
        # Statistics with torch operations even for host tensors (they are
        # always used for tensors elsewhere).
        self.on_device = on_device
        self._grads_on_device = None
        self.params = list(params) if params is not None else None
        self.verdict = None
        self.skipped = 0
        self._step = optimizer.step
        optimizer.step = self._gated_step

    def _grads(self):
        # Named when the parameters are (watch(..., params=model.named_parameters())):
        # a NaN is then reported with the tensor that holds it.
        if self.params is not None and self.params and isinstance(self.params[0], tuple):
            return {n: p.grad.detach().contiguous() for n, p in self.params if p.grad is not None}
        params = self.params
        if params is None:
            params = [p for g in self.optimizer.param_groups for p in g["params"]]
        return [p.grad.detach().contiguous() for p in params if p.grad is not None]

    @_torch.no_grad()
    def observe(self, step, loss, logits=None, labels=None, shards=None):
        """Statistics of this step (grads before clipping), and the verdict."""
        loss_value = float(loss.detach()) if isinstance(loss, _torch.Tensor) else float(loss)
        group = self.optimizer.param_groups[0]
        z = group.get("z_loss_alpha")
        kw = self._loss_scale()
        grads = self._grads()
        tensors = list(grads.values()) if isinstance(grads, dict) else grads
        if self._grads_on_device is None and tensors:
            # Parameters do not change devices while training: decided once.
            self._grads_on_device = any(g.device.type != "cpu" for g in tensors)
        if self.on_device or self._grads_on_device:
            names = list(grads.keys()) if isinstance(grads, dict) else None
            ss, bad, n, per_tensor = grad_stats(tensors, names)
            kw["grad_stats"] = (ss, bad, n)
            if per_tensor is not None and names is not None:
                kw["grad_tensors"] = per_tensor
        else:
            kw["grads"] = grads
        if logits is not None:
            logits = logits.detach()
            if self.on_device or logits.device.type != "cpu":
                kw["log_z"] = log_z_stats(logits, labels)
                logits = labels = None
            else:
                if logits.dtype not in (_torch.float32, _torch.bfloat16, _torch.float16):
                    logits = logits.float()
                logits = logits.reshape(-1, logits.shape[-1]).contiguous()
        if labels is not None:
            labels = [int(v) for v in labels.reshape(-1).tolist()]
        self.verdict = self.agent.step(
            int(step), loss=loss_value, logits=logits, labels=labels,
            # Names stay str; ids may come as tensors or numpy ints.
            shards=None if shards is None else [s if isinstance(s, str) else int(s) for s in shards],
            lr=float(group["lr"]), z_loss_alpha=None if z is None else float(z), **kw)
        if self.verdict.halt and kw.get("loss_scale_overflow"):
            # The scaler skips optimizer.step() on an overflow step, so the
            # gated step would never see this halt (overflows persisting).
            raise TrainingHalted(self.verdict)
        return self.verdict

    def _loss_scale(self):
        """Unscales the gradients (once per step) and reads the scaler's state:
        {} without an enabled scaler (bf16, fp32), else the scale and whether
        this step overflowed."""
        scaler = self.scaler
        if scaler is None or not scaler.is_enabled():
            return {}
        # GradScaler keeps each optimizer's stage and found_inf here (torch
        # 1.13 to 2.x); unscale_ raises when called twice before update().
        state = scaler._per_optimizer_states[id(self.optimizer)]
        if state["stage"].name != "UNSCALED":
            scaler.unscale_(self.optimizer)
        found_inf = state["found_inf_per_device"]
        if not found_inf:
            raise RuntimeError("the GradScaler has no found_inf for this optimizer after "
                               "unscale_(): was it given the optimizer that watch() wraps?")
        overflow = any(float(v) != 0.0 for v in found_inf.values())
        return {"loss_scale": float(scaler.get_scale()), "loss_scale_overflow": overflow}

    def _gated_step(self, *args, **kwargs):
        v = self.verdict
        self.verdict = None
        if v is not None and v.halt:
            raise TrainingHalted(v)
        if v is not None and v.skip:
            # The backward ran (its norm is known); the update does not.
            self.optimizer.zero_grad(set_to_none=True)
            self.skipped += 1
            return None
        return self._step(*args, **kwargs)

    def resume_from(self, step):
        """After loading the checkpoint of `step` in a rollback."""
        self.verdict = None
        self.agent.resume_from(int(step))

    def detach(self):
        """Gives the optimizer its own step() back."""
        self.optimizer.step = self._step


def watch(optimizer, agent, params=None, on_device=False, scaler=None):
    """Wraps `optimizer` so that its step() obeys the agent's verdicts.

    params: the parameters whose gradients count (default: the optimizer's);
    model.named_parameters() also names the tensor behind a NaN.
    on_device: compute statistics with torch operations even for host
    tensors (always done for tensors on a GPU).
    scaler: the fp16 run's torch.cuda.amp.GradScaler: statistics of the
    unscaled gradients, and its scale and overflows in the record."""
    return Guard(optimizer, agent, params, on_device, scaler)


def distributed_reduce(group=None):
    """A reduce callable for trainwatch.Agent over torch.distributed."""
    import torch.distributed as dist

    def reduce(sums, maxes):
        # NCCL reduces device tensors only; gloo and MPI host ones.
        device = "cpu"
        if dist.get_backend(group) == "nccl":
            device = _torch.device("cuda", _torch.cuda.current_device())
        s = _torch.tensor(sums, dtype=_torch.float64, device=device)
        m = _torch.tensor(maxes, dtype=_torch.float64, device=device)
        dist.all_reduce(s, op=dist.ReduceOp.SUM, group=group)
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        return s.tolist(), m.tolist()

    return reduce
