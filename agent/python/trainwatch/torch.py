"""Attach trainwatch to a PyTorch training loop.

torch 1.13 has no optimizer step hooks, so watch() wraps the optimizer's own
step(): after backward(), call observe() with the step's loss (and, when you
have them, the logits and the batch's shard ids); the next optimizer.step()
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
"""

import torch as _torch

from . import TrainingHalted

__all__ = ["watch", "Guard", "distributed_reduce"]


class Guard:
    """Holds the latest verdict and gates the wrapped optimizer's step()."""

    def __init__(self, optimizer, agent, params=None):
        self.optimizer = optimizer
        self.agent = agent
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
        if logits is not None:
            logits = logits.detach()
            if logits.dtype not in (_torch.float32, _torch.bfloat16, _torch.float16):
                logits = logits.float()
            logits = logits.reshape(-1, logits.shape[-1]).contiguous()
        if labels is not None:
            labels = [int(v) for v in labels.reshape(-1).tolist()]
        self.verdict = self.agent.step(
            int(step), loss=loss_value, grads=self._grads(),
            logits=logits, labels=labels,
            shards=None if shards is None else [int(s) for s in shards],
            lr=float(group["lr"]), z_loss_alpha=None if z is None else float(z))
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
        self.agent.resume_from(int(step))

    def detach(self):
        """Gives the optimizer its own step() back."""
        self.optimizer.step = self._step


def watch(optimizer, agent, params=None):
    """Wraps `optimizer` so that its step() obeys the agent's verdicts."""
    return Guard(optimizer, agent, params)


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
