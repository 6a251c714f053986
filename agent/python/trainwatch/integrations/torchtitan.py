"""trainwatch in torchtitan's Trainer (torchtitan 0.3)::

    import trainwatch
    from trainwatch.integrations.torchtitan import watch

    trainer = config.build()               # torchtitan's Trainer, as train.py makes it
    watch(trainer, run_id="my-run")        # once, before train()
    with trainwatch.exit_on_halt():
        trainer.train()

torchtitan's train_step runs forward and backward per micro-batch, clips
with torchtitan.distributed.utils.clip_grad_norm_ (get_total_norm over the
DTensor gradients, full_tensor(), a sum across pipeline stages), steps the
optimizers and the LR schedulers, and only then, on logging steps, raises
when the loss is not finite: the NaN's update is applied and no tensor is
named. trainwatch judges each step inside that clip, on the final
gradients before clipping and before the optimizers run:

- loss: the step's global average loss, as torchtitan logs it (the sum of
  forward_backward_step()'s results over the micro-batches, local sums over
  the global token count, times the ranks of the loss mesh, so that the
  agent's mean over ranks is torchtitan's sum); pipeline stages other than
  the last have no loss and report none;
- grad_norm, nan_frac and the tensors holding a NaN, from each DTensor
  gradient's local shard and placements (FSDP2, TP, HSDP; trainwatch.torch);
- log Z: from the logits the cross-entropy receives (under torchtitan's
  chunked loss, each chunk's, inside the wrapper), without tensor
  parallelism only: with it each rank holds a slice of the vocabulary (a
  plain tensor or a DTensor), and log Z is left out rather than taken over
  a slice;
- step: trainer.step, the step torchtitan logs and checkpoints.

A skip drops the step's gradients, so the optimizers leave every weight
and their state untouched (torchtitan still steps its LR schedulers and
counts the step). A halt raises trainwatch.TrainingHalted out of
trainer.train() before the update, naming the tensor and the rank holding
it; exit_on_halt() makes that exit status 3.

Why these places: optimizer hooks come after the clip (they see clipped
gradients), and torchtitan offers no callback. So watch() wraps, on this
trainer instance, train_step (to know the step is this trainer's),
forward_backward_step (the loss) and the loss function given the logits
(trainer.loss_fn, or the one inside its ChunkedLossWrapper), and replaces
the module function torchtitan.distributed.utils.clip_grad_norm_ by one
that judges the step first when called from a watched trainer's train_step
and is torchtitan's own otherwise.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional, Union

import torch as _torch
from torch.distributed.tensor import DTensor as _DTensor
from torchtitan.components.loss import ChunkedLossWrapper as _ChunkedLossWrapper
from torchtitan.components.loss import IGNORE_INDEX as _IGNORE_INDEX
from torchtitan.distributed import utils as _dist_utils

from .. import Agent, Verdict
from ..torch import Guard as _Guard, Layout
from ._common import act as _act, make_agent as _make_agent, wrap_method as _wrap_method

__all__ = ["watch", "TitanHook"]

_active: Optional[TitanHook] = None  # the hook whose trainer is inside train_step


def watch(trainer: Any, agent: Optional[Agent] = None, *,
          layout: Union[Layout, str, None] = None, replicas: Optional[int] = None,
          **agent_options: Any) -> TitanHook:
    """Attaches trainwatch to `trainer` (torchtitan.trainer.Trainer, built)
    and returns the hook (hook.guard, hook.verdict: the last step's).

    agent: a trainwatch.Agent for this rank; without one, watch() makes it
        from agent_options (server, run_id, rules, ... as trainwatch.Agent
        takes them) with torch.distributed's rank and world size, and
        closes it when train() returns or raises.
    layout, replicas: as trainwatch.torch.watch takes them; DTensor
        parameters (FSDP2, TP, HSDP) need neither, unless the mesh leaves
        ranks out (pipeline stages hold other parameters: replicas=1)."""
    missing = [m for m in ("train", "train_step", "forward_backward_step", "loss_fn")
               if not callable(getattr(trainer, m, None))]
    if missing:
        raise TypeError(f"trainwatch: this torchtitan Trainer has no {', '.join(missing)}: "
                        "torchtitan 0.3 is needed")
    _install_clip()
    return TitanHook(trainer, agent, agent_options, layout, replicas)


class TitanHook:
    """What watch() returns: guard, the trainwatch.torch.Guard; verdict, the
    last step's."""

    def __init__(self, trainer: Any, agent: Optional[Agent], agent_options: dict[str, Any],
                 layout: Union[Layout, str, None], replicas: Optional[int]) -> None:
        self.trainer = trainer
        dist = _torch.distributed
        rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        self.agent, self._owned = _make_agent(agent, agent_options, rank, world, "watch(trainer)")
        # The first model part's optimizer: the container's own param_groups
        # carry no learning rate (each optimizer of the container has its own).
        self.guard = _Guard(trainer.optimizers.optimizers[0], self.agent,
                            params=[(n, p) for m in trainer.model_parts
                                    for n, p in m.named_parameters()],
                            layout=layout, replicas=replicas, gate=False)
        self.verdict: Optional[Verdict] = None
        self._loss: Optional[_torch.Tensor] = None
        # torchtitan's micro-batch loss is a local sum over the global token
        # count: the loss mesh's ranks sum to the average (see the docstring).
        dims = trainer.parallel_dims
        mesh = dims.get_optional_mesh("loss") if dims.dp_cp_enabled else None
        self._loss_ranks: int = mesh.size() if mesh is not None else 1
        self._has_loss: bool = not dims.pp_enabled or trainer.pp_has_last_stage
        for name in ("train", "train_step", "forward_backward_step"):
            setattr(trainer, name, _wrap_method(getattr(trainer, name), getattr(self, name)))
        if not dims.tp_enabled:
            # The chunked wrapper gets hidden states; its inner loss the logits.
            owner = trainer
            while isinstance(owner.loss_fn, _ChunkedLossWrapper):
                owner = owner.loss_fn
            owner.loss_fn = _wrap_method(owner.loss_fn, self.logits)

    def train(self, orig: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return orig(*args, **kwargs)
        finally:
            if self._owned:
                self.agent.close()  # flushes the records, a halt's included

    def train_step(self, orig: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        global _active
        _active, self._loss = self, None
        try:
            return orig(*args, **kwargs)
        finally:
            _active = None

    def forward_backward_step(self, orig: Callable[..., Any], *args: Any,
                              **kwargs: Any) -> Any:
        loss = orig(*args, **kwargs)
        if self._has_loss:
            part = loss.detach().double().sum()
            self._loss = part if self._loss is None else self._loss + part
        return loss

    def logits(self, orig: Callable[..., Any], pred: _torch.Tensor, labels: _torch.Tensor,
               *args: Any, **kwargs: Any) -> Any:
        if _active is self and not isinstance(pred, _DTensor):
            self.guard.accumulate(logits=pred, labels=labels, ignore_index=_IGNORE_INDEX)
        return orig(pred, labels, *args, **kwargs)

    def judge(self) -> Verdict:
        loss, self._loss = self._loss, None
        if loss is not None:
            loss = loss * self._loss_ranks
        v = self.verdict = self.guard.observe(self.trainer.step, loss=loss)
        _act(v, self._parameters())
        return v

    def _parameters(self) -> Iterator[_torch.Tensor]:
        for m in self.trainer.model_parts:
            yield from m.parameters()


def _install_clip() -> None:
    orig: Callable[..., _torch.Tensor] = _dist_utils.clip_grad_norm_
    if getattr(orig, "_trainwatch", False):
        return

    def clip_grad_norm_(parameters: Any, max_norm: float, *args: Any,
                        **kwargs: Any) -> _torch.Tensor:
        hook = _active
        if hook is None:
            return orig(parameters, max_norm, *args, **kwargs)
        v = hook.judge()
        if v.skip:  # no update follows: nothing to clip
            return _torch.tensor(v.grad_norm)
        return orig(parameters, max_norm, *args, **kwargs)

    clip_grad_norm_.__wrapped__ = orig  # type: ignore[attr-defined]
    clip_grad_norm_._trainwatch = True  # type: ignore[attr-defined]
    _dist_utils.clip_grad_norm_ = clip_grad_norm_
