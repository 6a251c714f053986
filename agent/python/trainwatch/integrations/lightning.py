"""trainwatch in Lightning (lightning 2.6), as a callback::

    import trainwatch
    from trainwatch.integrations.lightning import TrainwatchCallback

    trainer = lightning.Trainer(callbacks=[TrainwatchCallback(run_id="my-run")], ...)
    with trainwatch.exit_on_halt():
        trainer.fit(model, loader)

Every optimizer step is judged once, in on_before_optimizer_step: after the
last micro-batch's backward (accumulate_grad_batches), after the AMP
scaler's unscale and before Lightning clips, so the norm is the pre-clip
one of the unscaled gradients:

- loss: the mean of the step's micro-batches' training_step losses (before
  Lightning divides them by accumulate_grad_batches), a NaN included;
- log Z: when training_step returns a dict with "logits" (and "labels",
  whose -100 rows are left out), as it may for its own use;
- shards: the batch's "trainwatch_shards" entry (shard_key=) when the batch
  is a dict, ids or names;
- step: trainer.global_step, the step Lightning's own logs name.

With an fp16 GradScaler (MixedPrecision("16-mixed", ...)) the record carries
the scale and overflows, and a fused optimizer, which Lightning leaves
scaled at this hook, is unscaled here first (GradScaler.step then does not
unscale again). A skip drops the step's gradients, so the optimizer leaves
every weight and its state bit-identical; Lightning still counts the step
(global_step advances, LR schedulers step). A halt raises
trainwatch.TrainingHalted out of trainer.fit(), naming the tensor;
exit_on_halt() makes that exit status 3.

Why a callback plus a wrapper of training_step: on_before_optimizer_step is
the one hook between the last backward and the clip (a wrapper of
optimizer.step would see the previous step's gradients, as Lightning calls
it before the closure runs backward), but no hook sees the micro-batch's
own loss (on_before_backward gets it divided and, under AMP, scaled) or
its logits before the update. So setup() wraps this LightningModule's
training_step, on the instance only, and teardown() restores it.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import lightning.pytorch as _pl
import torch as _torch

from .. import Agent, Verdict
from ..torch import Guard as _Guard
from ._common import act as _act, make_agent as _make_agent, shard_list as _shard_list
from ._common import wrap_method as _wrap_method

__all__ = ["TrainwatchCallback", "SHARD_KEY"]

SHARD_KEY = "trainwatch_shards"


class TrainwatchCallback(_pl.Callback):
    """agent: a trainwatch.Agent for this rank; without one the callback
    makes it from agent_options (server, run_id, rules, ... as
    trainwatch.Agent takes them) with the trainer's rank and world size, and
    closes it when fitting ends or fails.
    shard_key: the batch's entry holding its shard ids or names.
    replicas: for DTensor parameters, copies outside their mesh (see
    trainwatch.torch.watch).
    callback.guard: the trainwatch.torch.Guard while fitting; callback.verdict:
    the last step's."""

    def __init__(self, agent: Optional[Agent] = None, *, shard_key: str = SHARD_KEY,
                 replicas: Optional[int] = None, **agent_options: Any) -> None:
        self._given_agent = agent
        self._agent_options = agent_options
        self.shard_key = shard_key
        self.replicas = replicas
        self.agent: Optional[Agent] = None
        self._owned = False
        self.guard: Optional[_Guard] = None
        self.verdict: Optional[Verdict] = None
        self._module: Optional[_pl.LightningModule] = None

    # -- Lightning's hooks ------------------------------------------------------

    def setup(self, trainer: _pl.Trainer, pl_module: _pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self.agent, self._owned = _make_agent(self._given_agent, self._agent_options,
                                              trainer.global_rank, trainer.world_size,
                                              "TrainwatchCallback")
        setattr(pl_module, "training_step",
                _wrap_method(pl_module.training_step, self._training_step))
        self._module = pl_module

    def on_train_start(self, trainer: _pl.Trainer, pl_module: _pl.LightningModule) -> None:
        # The optimizer exists and the strategy has wrapped the model (DDP, FSDP).
        if len(trainer.optimizers) != 1:
            raise ValueError(f"TrainwatchCallback: {len(trainer.optimizers)} optimizers; "
                             "automatic optimization has one")
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        assert self.agent is not None
        self.guard = _Guard(trainer.optimizers[0], self.agent,
                            params=list(pl_module.named_parameters()), model=trainer.strategy.model,
                            scaler=scaler, replicas=self.replicas, gate=False)

    def on_before_optimizer_step(self, trainer: _pl.Trainer, pl_module: _pl.LightningModule,
                                 optimizer: _torch.optim.Optimizer) -> None:
        assert self.guard is not None
        v = self.verdict = self.guard.observe(trainer.global_step)
        _act(v, pl_module.parameters())

    def on_exception(self, trainer: _pl.Trainer, pl_module: _pl.LightningModule,
                     exception: BaseException) -> None:
        self._close()

    def teardown(self, trainer: _pl.Trainer, pl_module: _pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._close()

    # -- the step ---------------------------------------------------------------

    def _training_step(self, orig: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        out = orig(*args, **kwargs)
        self._micro_batch(args[0] if args else kwargs.get("batch"), out)
        return out

    def _micro_batch(self, batch: Any, out: Any) -> None:
        loss = out.get("loss") if isinstance(out, dict) else out
        if loss is None:  # training_step returned None: Lightning skips it too
            return
        logits = out.get("logits") if isinstance(out, dict) else None
        labels = out.get("labels") if isinstance(out, dict) else None
        if logits is not None and (labels is None or labels.shape != logits.shape[:-1]):
            labels = None
        shards = batch.get(self.shard_key) if isinstance(batch, dict) else None
        if self.guard is not None:  # None outside fit's training (validation)
            self.guard.accumulate(loss=loss, logits=logits, labels=labels,
                                  shards=_shard_list(shards))

    def _close(self) -> None:
        if self._module is not None:
            self._module.__dict__.pop("training_step", None)  # the class's method again
            self._module = None
        if self._owned and self.agent is not None:
            # Flushes the records, a halt's included, to trainwatchd.
            self.agent.close()
        self.agent = None if self._owned else self.agent
        self.guard = None
