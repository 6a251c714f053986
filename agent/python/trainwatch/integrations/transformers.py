"""trainwatch in the Hugging Face Trainer (transformers 5), on an unmodified
Trainer::

    import trainwatch
    from trainwatch.integrations.transformers import watch

    trainer = Trainer(model=model, args=args, train_dataset=dataset)
    watch(trainer, run_id="my-run")       # once, before train()
    with trainwatch.exit_on_halt():
        trainer.train()

Every optimizer step is judged once, after its last micro-batch's backward
(and the DDP all-reduce), before the Trainer clips:

- loss: the step's training loss as the Trainer computes it (the sum of
  training_step()'s results over the accumulation window), a NaN included:
  it is read before the Trainer's logging_nan_inf_filter replaces it;
- grad_norm: the global norm before clipping, with max_grad_norm on or off
  (the Trainer's own grad_norm log shows the same number); the clip itself
  is Guard.clip_grad_norm_, torch's clip on that norm without a second pass;
- log Z: from the model's logits, every row whose label is not -100 (for a
  causal LM, the rows predicting a label, shifted as the Trainer's loss is);
- shards: each example's "trainwatch_shards" field (shard_key=), an int id
  or a str name, which watch() keeps through remove_unused_columns and takes
  out of the batch before the model sees it.

A skip drops the step's gradients: AdamW (any torch optimizer) then leaves
every weight and its state bit-identical. The Trainer still counts the step:
global_step advances, the LR scheduler steps, and its log shows the step's
grad_norm. A halt raises trainwatch.TrainingHalted out of trainer.train(),
naming the tensor; exit_on_halt() makes that exit status 3.

Why wrap the Trainer's own methods and not a TrainerCallback: callbacks
receive neither the loss nor the gradients' norm, on_pre_optimizer_step runs
after the clip, and TrainerControl cannot skip a step. So watch() wraps, on
this Trainer instance only, training_step (the step's loss), compute_loss
(logits and shards), _clip_grad_norm and _get_grad_norm (the point between
the last backward and the clip, whether clipping is on or off). Those two
are Trainer methods of transformers 5; watch() checks that they exist.
DeepSpeed is refused: its engine keeps the gradients and clips them itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

import torch as _torch

from .. import Agent, Verdict
from ..torch import Guard as _Guard
from ._common import act as _act, make_agent as _make_agent, shard_list as _shard_list
from ._common import wrap_method as _wrap_method

if TYPE_CHECKING:
    import transformers

__all__ = ["watch", "SHARD_KEY"]

SHARD_KEY = "trainwatch_shards"
_HOOKED = ("training_step", "compute_loss", "_clip_grad_norm", "_get_grad_norm")


def watch(trainer: transformers.Trainer, agent: Optional[Agent] = None, *,
          shard_key: str = SHARD_KEY, replicas: Optional[int] = None,
          **agent_options: Any) -> TrainerHook:
    """Attaches trainwatch to `trainer` (a transformers.Trainer, or a subclass
    such as TRL's) and returns the hook (hook.guard: the trainwatch.torch.Guard
    once training started; hook.verdict: the last step's).

    agent: a trainwatch.Agent for this rank; without one, watch() makes it
        from agent_options (server, run_id, rules, ... as trainwatch.Agent
        takes them) with the Trainer's rank and world size, and closes it
        when train() returns or raises.
    shard_key: the examples' field holding their shard id or name.
    replicas: for DTensor parameters, copies outside their mesh (see
        trainwatch.torch.watch)."""
    missing = [m for m in _HOOKED if not callable(getattr(trainer, m, None))]
    if missing:
        import transformers
        raise TypeError(f"trainwatch: this Trainer (transformers {transformers.__version__}) has "
                        f"no {', '.join(missing)}: transformers 5 is needed")
    if getattr(trainer, "is_deepspeed_enabled", False):
        raise ValueError("trainwatch: the DeepSpeed engine keeps the gradients and clips them "
                         "itself, so a Trainer under DeepSpeed cannot be watched here; "
                         "`twctl follow` reads its log")
    return TrainerHook(trainer, agent, agent_options, shard_key, replicas)


class TrainerHook:
    """What watch() returns: guard, the trainwatch.torch.Guard once training
    started; verdict, the last step's; agent, the agent (None between two
    train() calls when watch() made it)."""

    def __init__(self, trainer: transformers.Trainer, agent: Optional[Agent],
                 agent_options: dict[str, Any], shard_key: str,
                 replicas: Optional[int]) -> None:
        self.trainer = trainer
        self.shard_key = shard_key
        self.replicas = replicas
        args = trainer.args
        self._agent_options = agent_options
        self.agent: Optional[Agent]
        self.agent, self._owned = _make_agent(agent, agent_options, args.process_index,
                                              args.world_size, "watch(trainer)")
        self.guard: Optional[_Guard] = None
        self.verdict: Optional[Verdict] = None
        # The step's loss so far: training_step()'s sum.
        self._loss: Optional[_torch.Tensor] = None
        self._causal = _is_causal_lm(trainer)
        if args.remove_unused_columns:
            # The shard field is not an argument of the model's forward, so the
            # Trainer would drop it from the dataset; it leaves by compute_loss.
            trainer._set_signature_columns_if_needed()
            # (typed None in transformers: set by the call above)
            columns: list[str] = getattr(trainer, "_signature_columns")
            if shard_key not in columns:
                columns.append(shard_key)
        for name in _HOOKED + ("train",):
            setattr(trainer, name, _wrap_method(getattr(trainer, name),
                                                getattr(self, name.lstrip("_"))))

    # -- the wrapped methods (the Trainer's own run inside) --------------------

    def train(self, orig: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self._owned and self.agent is None:
            # A second train() after the first closed its agent.
            self.agent, _ = _make_agent(None, self._agent_options, self.trainer.args.process_index,
                                        self.trainer.args.world_size, "watch(trainer)")
            self.guard = None
        assert self.agent is not None
        try:
            return orig(*args, **kwargs)
        finally:
            self._loss = None
            if self._owned:
                # Flushes the records, the halt's included, to trainwatchd.
                self.agent.close()
                self.agent = None

    def training_step(self, orig: Callable[..., Any], model: _torch.nn.Module,
                      inputs: Any, *args: Any, **kwargs: Any) -> Any:
        loss = orig(model, inputs, *args, **kwargs)
        # The Trainer's loss for this micro-batch, already divided for the
        # accumulation window: the window's sum is the step's loss. Kept on
        # its device until the step is judged.
        part = loss.detach().double()
        self._loss = part if self._loss is None else self._loss + part
        return loss

    def compute_loss(self, orig: Callable[..., Any], model: _torch.nn.Module, inputs: Any,
                     return_outputs: bool = False, *args: Any, **kwargs: Any) -> Any:
        shards = inputs.get(self.shard_key) if isinstance(inputs, dict) else None
        if shards is not None or (isinstance(inputs, dict) and self.shard_key in inputs):
            inputs = {k: v for k, v in inputs.items() if k != self.shard_key}
        if not model.training:  # evaluation: nothing to record
            return orig(model, inputs, return_outputs, *args, **kwargs)
        labels = inputs.get("labels") if isinstance(inputs, dict) else None
        loss, outputs = orig(model, inputs, True, *args, **kwargs)
        logits = _logits(outputs)
        guard = self._guard()
        if logits is not None:
            if labels is not None and labels.shape == logits.shape[:-1]:
                if self._causal:
                    logits, labels = logits[..., :-1, :], labels[..., 1:]
            else:
                labels = None
            guard.accumulate(logits=logits, labels=labels, ignore_index=-100)
        if shards is not None:
            guard.accumulate(shards=_shard_list(shards))
        return (loss, outputs) if return_outputs else loss

    def clip_grad_norm(self, orig: Callable[..., Any], model: _torch.nn.Module) -> _torch.Tensor:
        v = self._observe()
        if v.skip:
            return _torch.tensor(v.grad_norm)
        return self._guard().clip_grad_norm_(self.trainer.args.max_grad_norm)

    def get_grad_norm(self, orig: Callable[..., Any], model: _torch.nn.Module,
                      grad_norm: Any = None, *args: Any, **kwargs: Any) -> Any:
        if grad_norm is not None:  # the clip's: judged there
            return orig(model, grad_norm, *args, **kwargs)
        # Clipping off: the verdict's norm, instead of a norm pass of the Trainer's.
        return _torch.tensor(self._observe().grad_norm)

    # -- the step ---------------------------------------------------------------

    def _guard(self) -> _Guard:
        if self.guard is None:
            t = self.trainer
            opt, trained = t.optimizer, t.model
            assert opt is not None and trained is not None  # made before the first step
            inner = getattr(opt, "optimizer", opt)  # accelerate's wrapper: the torch optimizer
            scaler = getattr(t.accelerator, "scaler", None)
            model = t.model_wrapped if t.model_wrapped is not t.model else t.model
            assert self.agent is not None
            self.guard = _Guard(inner, self.agent, params=list(trained.named_parameters()),
                                model=model, scaler=scaler, replicas=self.replicas, gate=False)
        return self.guard

    def _observe(self) -> Verdict:
        guard = self._guard()
        loss, self._loss = self._loss, None
        step = self.trainer.state.global_step + 1  # the step the Trainer logs it as
        v = self.verdict = guard.observe(step, loss=loss)
        trained = self.trainer.model
        assert trained is not None
        _act(v, trained.parameters())
        return v



def _logits(outputs: Any) -> Optional[_torch.Tensor]:
    if isinstance(outputs, dict):  # a ModelOutput is one
        return outputs.get("logits")
    if isinstance(outputs, (tuple, list)) and len(outputs) > 1 and \
            isinstance(outputs[1], _torch.Tensor):
        return outputs[1]  # (loss, logits, ...), as models return without return_dict
    return None


def _is_causal_lm(trainer: transformers.Trainer) -> bool:
    """Whether the model's logits at position t predict the label at t + 1
    (the Trainer shifts the labels of these models the same way)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    model = trainer.accelerator.unwrap_model(trainer.model)
    base = getattr(model, "get_base_model", None)  # PEFT
    if callable(base):
        model = base()
    return model._get_name() in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()
