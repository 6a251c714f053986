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

With gradient accumulation, give each micro-batch to accumulate() and call
observe(step) once per optimizer step: the step's loss is the mean of the
micro-batches' losses, log Z covers every counted row of every micro-batch
(kept as a running sum and a row count, so no logits stay alive) and the
shards are all of theirs::

    for micro in range(accum):
        logits = model(x[micro])
        loss = loss_fn(logits, y[micro])
        (loss / accum).backward()
        guard.accumulate(loss, logits=logits, labels=y[micro], shards=ids[micro],
                         ignore_index=-1)
    guard.observe(step)
    optimizer.step()

Host tensors are read in place by the package's statistics kernels. Tensors
on a GPU (or anywhere else) are reduced there with torch's own operations
(grad_stats() and log_z_stats()), and only a few numbers cross to the host.
"""

import math as _math

import torch as _torch

from . import TrainingHalted
from . import exit_on_halt  # noqa: F401  (trainwatch.torch.exit_on_halt, for trainers)
from ._trainwatch import log_z_sum as _host_log_z_sum

__all__ = ["watch", "Guard", "distributed_reduce", "grad_stats", "log_z_stats",
           "exit_on_halt"]


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


def _device_log_z_sum(logits, labels=None, ignore_index=-100):
    """(sum of log Z over counted rows, rows) as tensors on the logits'
    device, log Z in float32 and the sum in float64: no host sync, so
    micro-batches add up on the device and cross to the host once."""
    lz = _torch.logsumexp(logits.reshape(-1, logits.shape[-1]).float(), dim=-1)
    if labels is not None:
        lz = lz[labels.reshape(-1).to(lz.device) != ignore_index]
    return lz.double().sum(), lz.numel()


def log_z_stats(logits, labels=None, ignore_index=-100):
    """Mean log partition function over the rows of [..., vocab] logits (rows
    whose label is ignore_index left out), computed on the logits' device in
    float32; NaN when any counted row's log Z is not finite, None without
    rows."""
    total, rows = _device_log_z_sum(logits, labels, ignore_index)
    if rows == 0:
        return None
    mean = float(total) / rows
    return mean if _math.isfinite(mean) else _math.nan


class Guard:
    """Holds the latest verdict and gates the wrapped optimizer's step()."""

    def __init__(self, optimizer, agent, params=None, on_device=False):
        self.optimizer = optimizer
        self.agent = agent
        # Statistics with torch operations even for host tensors (they are
        # always used for tensors elsewhere).
        self.on_device = on_device
        self._grads_on_device = None
        self.params = list(params) if params is not None else None
        self.verdict = None
        self.skipped = 0
        self._clear_micro_batches()
        self._step = optimizer.step
        optimizer.step = self._gated_step

    def _clear_micro_batches(self):
        # The optimizer step being accumulated: the losses' sum (a float, or
        # a device tensor until observe()), log Z's sum and rows, the shards.
        self._losses, self._loss_sum = 0, 0.0
        self._log_z_sum, self._log_z_rows = 0.0, 0
        self._shards = []

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
    def accumulate(self, loss=None, logits=None, labels=None, shards=None, ignore_index=-100):
        """One micro-batch of the optimizer step observe() will judge.

        loss: the micro-batch's own loss (not divided by the accumulation
            count; observe() reports the mean), a tensor or a number, or None.
        logits, labels: [..., vocab] logits and their labels; rows whose label
            is ignore_index (nanoGPT: -1, Hugging Face: -100) are left out of
            log Z. Reduced at once to a sum and a row count: nothing is kept.
        shards: the micro-batch's shard ids or names (see trainwatch.Agent).
        """
        if loss is not None:
            # A device loss stays on its device until observe(): no sync here.
            self._loss_sum = self._loss_sum + (
                loss.detach().double() if isinstance(loss, _torch.Tensor) else float(loss))
            self._losses += 1
        if labels is not None and logits is None:
            raise ValueError("accumulate: labels without logits")
        if logits is not None:
            logits = logits.detach()
            if self.on_device or logits.device.type != "cpu":
                total, rows = _device_log_z_sum(logits, labels, ignore_index)
            else:
                if logits.dtype not in (_torch.float32, _torch.bfloat16, _torch.float16):
                    logits = logits.float()
                total, rows = _host_log_z_sum(
                    logits.reshape(-1, logits.shape[-1]).contiguous(),
                    None if labels is None else labels.reshape(-1).tolist(), int(ignore_index))
            self._log_z_sum = self._log_z_sum + total
            self._log_z_rows += rows
        if shards is not None:
            # Names stay str; ids may come as tensors or numpy ints.
            self._shards.extend(s if isinstance(s, str) else int(s) for s in shards)

    @_torch.no_grad()
    def observe(self, step, loss=None, logits=None, labels=None, shards=None, ignore_index=-100):
        """Statistics of this optimizer step (grads before clipping), and the
        verdict. With loss, logits, labels or shards given, they are one more
        micro-batch (see accumulate()); a loop without accumulation gives
        them here and never calls accumulate()."""
        if loss is not None or logits is not None or labels is not None or shards is not None:
            self.accumulate(loss, logits=logits, labels=labels, shards=shards,
                            ignore_index=ignore_index)
        loss_value = float(self._loss_sum) / self._losses if self._losses else None
        log_z = None
        if self._log_z_rows:
            total = float(self._log_z_sum)
            # Any counted row whose log Z is not finite makes the step's NaN.
            log_z = (total if _math.isfinite(total) else _math.nan, self._log_z_rows)
        shards = self._shards or None
        self._clear_micro_batches()
        group = self.optimizer.param_groups[0]
        z = group.get("z_loss_alpha")
        kw = {}
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
        self.verdict = self.agent.step(
            int(step), loss=loss_value, log_z_sum=log_z, shards=shards,
            lr=float(group["lr"]), z_loss_alpha=None if z is None else float(z), **kw)
        return self.verdict

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
        self._clear_micro_batches()  # micro-batches of an abandoned step
        self.agent.resume_from(int(step))

    def detach(self):
        """Gives the optimizer its own step() back."""
        self.optimizer.step = self._step


def watch(optimizer, agent, params=None, on_device=False):
    """Wraps `optimizer` so that its step() obeys the agent's verdicts.

    params: the parameters whose gradients count (default: the optimizer's);
    model.named_parameters() also names the tensor behind a NaN.
    on_device: compute statistics with torch operations even for host
    tensors (always done for tensors on a GPU)."""
    return Guard(optimizer, agent, params, on_device)


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
