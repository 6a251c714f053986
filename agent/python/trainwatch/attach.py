"""Enforcing with no code change: what `trainwatch run` attaches to each rank
of a torch job (trainwatch/_bootstrap/sitecustomize.py loads this module when
the program imports torch, in the processes that are ranks).

Every optimizer built in the process gets a gate in front of its step(), the
same gate trainwatch.torch.watch() puts there, and the gate asks one Guard
for the verdict of the step it lets through:

- grad_norm before clipping: judged at the trainer's own clip call when it
  makes one (torch.nn.utils.clip_grad_norm_ and get_total_norm both take the
  norm through clip_grad._get_total_norm, which is wrapped: a name bound by
  `from ... import` before the patch still goes through it), else at the
  step; either way the Guard computes it from the gradients, so it is the
  same number, and at a clip torch's clip scales by it instead of reading
  the gradients again.
- loss: the scalars backward() is called on since the last step, summed
  (a loss divided by the accumulation count sums to the step's mean), with
  a GradScaler's scale taken back out.
- log Z: the output of the module whose output reaches the model's output
  with its last dimension (the vocabulary), found in the first step by
  global module hooks that are removed at the first verdict; from then on
  one forward hook on that module alone.
- layout: DDP (its constructor is watched), DTensor placements (FSDP2,
  tensor parallel, both), one process.
- shards: a `shard_ids`, `shards`, `shard_id` or `shard` field of a dict
  batch from a DataLoader.

A skip does not call the optimizer's step at all, so parameters and state
stay bit-identical whatever the optimizer does with a None gradient. A halt
prints one line naming the tensor and the rank, records the halt for the
launcher, and ends the process with status 3. What cannot be enforced is
watched observe-only, said once, and never reported as skipped.

Failures to attach print `trainwatch: not attached: <why>` and leave the job
running as it would without trainwatch (TRAINWATCH_REQUIRE=1: exit 2 before
the first step instead).
"""

from __future__ import annotations

import math
import os
import sys
import types
import weakref
from typing import Any, Callable, Optional

import torch

from . import Agent, TrainingHalted, Verdict
from ._first_step import FirstStep
from ._placements import is_dtensor
from .integrations._common import shard_list
from .torch import Guard, distributed_reduce

# Batch fields that hold the batch's shard ids or names, in this order.
SHARD_FIELDS = ("shard_ids", "shards", "shard_id", "shard")

_attachment: Optional[Attachment] = None


def on_import(name: str, module: Any) -> None:
    """Called by the bootstrap once `name` is imported in a rank."""
    global _attachment
    if name == "torch":
        if _attachment is None:
            _attachment = Attachment(os.environ)
            _attachment.patch()
    elif _attachment is not None:
        _attachment.trainer_imported(name, module)


def state() -> dict[str, Any]:
    """What this process holds, for tests and --explain: role, whether it is
    attached, whether it has an agent, the summary."""
    a = _attachment
    return {"role": os.environ.get("TRAINWATCH_ROLE", ""),
            "attached": a is not None and not a.inert,
            "agent": a is not None and a.agent is not None and not a.inert,
            "summary": None if a is None else a.summary}


def _say(text: str) -> None:
    # One write per line: ranks share the launcher's stderr.
    sys.stderr.write(f"trainwatch: {text}\n")
    sys.stderr.flush()


class Attachment:
    """The process's one attachment: the patches, what the first step found (FirstStep),
    and the Guard and Agent made at the first verdict. Used from the training
    thread only (the trainer's own)."""

    def __init__(self, environ: Any) -> None:
        self.observe_only = environ.get("TRAINWATCH_OBSERVE_ONLY") == "1"
        self.require = environ.get("TRAINWATCH_REQUIRE") == "1"
        self.explain = environ.get("TRAINWATCH_EXPLAIN") == "1"
        self.state_dir = environ.get("TRAINWATCH_STATE_DIR", "")
        self.default_run_id = str(environ.get("TRAINWATCH_DEFAULT_RUN_ID", ""))
        self.inert = False          # forked helper, detached, or delegated
        self.delegated = ""         # who acts instead (an integration, watch())
        self.started = False
        self.agent: Optional[Agent] = None
        self.guard: Optional[Guard] = None
        self.summary: Optional[dict[str, str]] = None
        self.enforcing = not self.observe_only
        self.rank = 0
        self.acted: Optional[Verdict] = None  # the verdict last acted on
        self.would_have_halted = False
        self.observe_reason = "--observe-only" if self.observe_only else ""
        self.step = 0
        self.verdict: Optional[Verdict] = None
        self.fresh = True           # a backward ran since the last verdict
        self.in_gate = False
        self.in_backward = False
        self.judged_at = ""         # where the first verdict was taken
        self.optimizers: list[weakref.ReferenceType[torch.optim.Optimizer]] = []
        self.ddp: list[weakref.ReferenceType[torch.nn.Module]] = []
        # The micro-batches of the step being accumulated.
        self.loss_sum: Any = None
        self.scaled_sum: Any = None
        self.micro_batches = 0
        self.shards: list[Any] = []
        self.shard_field = ""
        self.scaler: Any = None
        self.scaled: dict[int, weakref.ReferenceType[torch.Tensor]] = {}
        self.first = FirstStep()

    # ---- patches -------------------------------------------------------

    def patch(self) -> None:
        """Wraps what the trainer calls (each wrapper passes straight through
        once this process is inert) and starts the first-step discovery. The
        wrappers take their object positional-only: callers name the wrapped
        methods' own parameters (DistributedDataParallel(module=...))."""
        att = self
        optim = torch.optim.Optimizer
        init = optim.__init__

        def optimizer_init(opt: Any, /, *args: Any, **kwargs: Any) -> None:
            init(opt, *args, **kwargs)
            att.adopt(opt)
        setattr(optim, "__init__", optimizer_init)

        backward = torch.autograd.backward

        def autograd_backward(tensors: Any, grad_tensors: Any = None, *args: Any,
                              **kwargs: Any) -> Any:
            if att.inert:
                return backward(tensors, grad_tensors, *args, **kwargs)
            att.backward_called(tensors, grad_tensors)
            att.in_backward = True
            try:
                return backward(tensors, grad_tensors, *args, **kwargs)
            finally:
                att.in_backward = False
        setattr(torch.autograd, "backward", autograd_backward)

        import torch.nn.utils.clip_grad as clip_grad
        total_norm = clip_grad._get_total_norm

        def get_total_norm(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            if att.inert:
                return total_norm(tensors, *args, **kwargs)
            grads = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
            norm_type = args[0] if args else kwargs.get("norm_type", 2.0)
            judged = att.pre_clip(grads, float(norm_type) == 2.0)
            return judged if judged is not None else total_norm(grads, *args, **kwargs)
        setattr(clip_grad, "_get_total_norm", get_total_norm)
        setattr(torch.nn.utils, "get_total_norm", get_total_norm)

        scaler_cls = torch.amp.grad_scaler.GradScaler
        scale, scaler_step = scaler_cls.scale, scaler_cls.step

        def scaler_scale(scaler: Any, /, outputs: Any) -> Any:
            out = scale(scaler, outputs)
            if not att.inert and isinstance(out, torch.Tensor) and scaler.is_enabled():
                att.scaler = scaler
                att.scaled[id(out)] = weakref.ref(out)
            return out
        setattr(scaler_cls, "scale", scaler_scale)

        def scaler_step_(scaler: Any, /, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            # The scaler skips optimizer.step() on an overflow: judged here,
            # so that the overflow is recorded (tier 0) all the same.
            if not att.inert and not att.in_gate and scaler.is_enabled():
                att.scaler = scaler
                att.decide(optimizer)
            return scaler_step(scaler, optimizer, *args, **kwargs)
        setattr(scaler_cls, "step", scaler_step_)

        ddp = torch.nn.parallel.DistributedDataParallel
        ddp_init = ddp.__init__

        def ddp_init_(module: Any, /, *args: Any, **kwargs: Any) -> None:
            ddp_init(module, *args, **kwargs)
            att.ddp.append(weakref.ref(module))
        setattr(ddp, "__init__", ddp_init_)

        import torch.utils.data.dataloader as dataloader
        iter_next = dataloader._BaseDataLoaderIter.__next__

        def loader_next(it: Any, /) -> Any:
            batch = iter_next(it)
            if not att.inert:
                att.batch_loaded(batch)
            return batch
        setattr(dataloader._BaseDataLoaderIter, "__next__", loader_next)

        from torch.optim.optimizer import register_optimizer_step_pre_hook
        register_optimizer_step_pre_hook(self.ungated_step)

        self.first.start()
        os.register_at_fork(after_in_child=self.forked)

    def forked(self) -> None:
        # A forked DataLoader worker (or any fork of a rank): it copied this
        # object, not the agent's threads; it must never judge nor send.
        # The agent object stays referenced: its destructor would wait on
        # threads this process does not have.
        self.inert = True
        self.first.stop()

    def trainer_imported(self, name: str, module: Any) -> None:
        """The trainers that own their loop take their integration when
        constructed, made with this run's options, and the gates then stand
        aside."""
        def wrap(cls: Any, attach: Callable[[Any, dict[str, Any]], object], who: str) -> None:
            init = cls.__init__

            def trainer_init(trainer: Any, /, *args: Any, **kwargs: Any) -> None:
                init(trainer, *args, **kwargs)
                if self.inert or self.started:
                    return
                self.delegate(who)
                attach(trainer, self.integration_options())
            setattr(cls, "__init__", trainer_init)

        # Each integration is imported when its Trainer is constructed, not
        # here: the trainer's package is still initialising at this point.
        if name == "transformers.trainer":
            def hf_watch(trainer: Any, options: dict[str, Any]) -> None:
                from .integrations import transformers as hf
                hf.watch(trainer, **options)
            wrap(module.Trainer, hf_watch, "the Hugging Face Trainer integration")
        elif name in ("lightning.pytorch.trainer.trainer", "pytorch_lightning.trainer.trainer"):
            def add_callback(trainer: Any, options: dict[str, Any]) -> None:
                from .integrations import lightning as pl
                trainer.callbacks.append(pl.TrainwatchCallback(**options))
            wrap(module.Trainer, add_callback, "the Lightning integration")
        elif name == "torchtitan.trainer":
            def titan_watch(trainer: Any, options: dict[str, Any]) -> None:
                from .integrations import torchtitan as tt
                tt.watch(trainer, **options)
            wrap(module.Trainer, titan_watch, "the torchtitan integration")

    def integration_options(self) -> dict[str, Any]:
        """The Agent options an integration's agent takes from this run (the
        rest it reads from TRAINWATCH_* as any agent does)."""
        mode = "enforcing (skip and halt)" if self.enforcing else \
            f"observe-only ({self.observe_reason})"
        options: dict[str, Any] = {"attachment": f"through {self.delegated}; mode: {mode}"}
        run_id = self.run_id()
        if run_id:
            options["run_id"] = run_id
        if not self.enforcing:
            options["observed"] = True
        return options

    def run_id(self) -> str:
        """The launcher's default run id, where nothing names the job: the
        agent itself prefers TRAINWATCH_RUN_ID, torchrun's id, SLURM's."""
        if os.environ.get("TRAINWATCH_RUN_ID") or os.environ.get("SLURM_JOB_ID") or \
                os.environ.get("TORCHELASTIC_RUN_ID", "none") != "none":
            return ""
        return self.default_run_id

    def delegate(self, who: str) -> None:
        from .integrations import _common
        self.delegated = who
        self.inert = True
        self.first.stop()
        _common.enforcing = self.enforcing
        _common.halt_handler = self.delegated_halt
        if int(os.environ.get("RANK", "0")) == 0:
            mode = "" if self.enforcing else f", observe-only ({self.observe_reason})"
            _say(f"attached through {who}{mode}")
        if self.explain:  # what was found is the integration: nothing more to say
            sys.stdout.flush()
            os._exit(0)

    def delegated_halt(self, v: Verdict) -> None:
        """An integration's halt: the line and the launcher's record, then
        SystemExit(3) through the trainer, so that the integration closes
        (and flushes) its agent on the way out."""
        self.record_halt(v)
        raise SystemExit(3)

    # ---- what the trainer does ----------------------------------------

    def adopt(self, opt: torch.optim.Optimizer) -> None:
        """Puts the gate in front of a new optimizer's step(): an instance
        attribute bound to the optimizer, as LR schedulers expect
        (they rewrap opt.step through its __func__)."""
        if self.inert:
            return
        self.optimizers.append(weakref.ref(opt))
        inner = opt.__dict__.get("step")
        att = self

        def step(o: Any, /, *args: Any, **kwargs: Any) -> Any:
            def run(*a: Any, **kw: Any) -> Any:
                return inner(*a, **kw) if inner is not None else type(o).step(o, *a, **kw)
            return att.gate(o, run, args, kwargs)
        setattr(opt, "step", types.MethodType(step, opt))

    def gate(self, opt: Any, run: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> Any:
        if self.inert or self.in_gate:  # a container's inner optimizers pass
            return run(*args, **kwargs)
        self.in_gate = True
        try:
            closure = kwargs.get("closure", args[0] if args and callable(args[0]) else None)
            if closure is not None:
                return self.step_with_closure(opt, run, closure, args, kwargs)
            if self.in_backward and not self.started:
                self.observe_reason = ("the optimizer steps inside backward (optimizer-in-"
                                       "backward): there is no update left to skip")
            v = self.decide(opt)
            if v is not None and self.act(v):
                for ref in self.optimizers:
                    o = ref()
                    if o is not None:
                        o.zero_grad(set_to_none=True)
                return None
            return run(*args, **kwargs)
        finally:
            self.in_gate = False

    def step_with_closure(self, opt: Any, run: Callable[..., Any], closure: Callable[[], Any],
                          args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """optimizer.step(closure): the forward and backward run inside the
        step, so the verdict comes after the closure, and a skip can only
        drop the gradients, which a torch.optim optimizer honours (it passes
        over parameters without one); any other optimizer is watched
        observe-only."""
        if not self.started and not type(opt).__module__.startswith("torch.optim"):
            self.observe_reason = (f"{type(opt).__name__}.step(closure) runs the backward "
                                   "inside the step, and a skip would rest on it passing over "
                                   "parameters without a gradient, which only torch.optim's "
                                   "optimizers are known to do")
        judged = False

        def judged_closure() -> Any:
            nonlocal judged
            loss = closure()
            if not judged:
                judged = True
                self.decide_dropping_gradients(opt)
            return loss
        if "closure" in kwargs:
            kwargs = dict(kwargs, closure=judged_closure)
        else:
            args = (judged_closure,) + tuple(args[1:])
        return run(*args, **kwargs)

    def ungated_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        """The global step pre-hook: a step that bypassed the gate (a
        subclass that set its own step attribute). It can only halt or drop
        the gradients, as step_with_closure does."""
        if self.inert or self.in_gate:
            return None
        if not self.started and not type(opt).__module__.startswith("torch.optim"):
            self.observe_reason = (f"{type(opt).__name__}.step() bypasses the gate trainwatch "
                                   "puts on optimizers")
        self.decide_dropping_gradients(opt)
        return None

    def decide_dropping_gradients(self, opt: Any) -> None:
        """The verdict where the optimizer's step runs regardless: a skip
        can only drop the gradients, which a torch.optim optimizer honours
        (elsewhere observe_reason has made the run observe-only)."""
        v = self.decide(opt)
        if v is not None and self.act(v):
            for group in opt.param_groups:
                for p in group["params"]:
                    p.grad = None

    def backward_called(self, tensors: Any, grad_tensors: Any) -> None:
        self.first.depth = 0  # a forward that raised left it unbalanced
        if self.agent is not None:
            # Where DDP and FSDP wait on the other ranks: the heartbeats'
            # lead time, which names a straggler (docs/hangs.md).
            self.agent.set_phase("backward")
        t = tensors[0] if isinstance(tensors, (list, tuple)) and len(tensors) == 1 else tensors
        if not isinstance(t, torch.Tensor) or t.numel() != 1:
            return  # not a loss (a pipeline stage's output, a vector-Jacobian product)
        if grad_tensors is not None and not isinstance(grad_tensors, (list, tuple)) and \
                not bool(torch.all(grad_tensors == 1)):
            return
        self.fresh = True
        value = t.detach().reshape(()).double()
        ref = self.scaled.pop(id(t), None)
        if ref is not None and ref() is t:
            self.scaled_sum = value if self.scaled_sum is None else self.scaled_sum + value
        else:
            self.loss_sum = value if self.loss_sum is None else self.loss_sum + value
        self.micro_batches += 1

    def batch_loaded(self, batch: Any) -> None:
        if not isinstance(batch, dict):
            return
        for name in SHARD_FIELDS:
            if name in batch:
                self.shard_field = name
                self.shards.extend(shard_list(batch[name]) or [])
                return

    def pre_clip(self, grads: list[torch.Tensor], two_norm: bool) -> Optional[torch.Tensor]:
        """The trainer takes the gradients' norm (to clip them): the verdict
        is taken now, from the gradients before clipping, when these are the
        gradients the gate watches. Its 2-norm is then the trainer's too, as
        Guard.clip_grad_norm_ uses it: a tensor of the gradients' dtype on
        their device, so that torch's clip does not read them a second time.
        None (torch takes the norm itself) for another norm, DTensors (whose
        norm torch returns as a DTensor), a nonfinite norm (torch's NaN or
        inf, and its error_if_nonfinite) or a verdict taken earlier (the
        gradients may have been clipped since)."""
        if self.in_backward or not self.optimizers:
            return None
        given = {id(g) for g in grads}
        watched = {id(p.grad) for p in self.parameters() if p.grad is not None}
        if not given or given != watched:
            return None  # a part of the model: not the step's norm
        opt = self.optimizers[0]()
        if opt is None:
            return None
        self.judged_at = self.judged_at or "clip"
        fresh = self.fresh
        v = self.decide(opt)
        if v is None or not fresh or not two_norm or v.nan_frac > 0 or \
                not math.isfinite(v.grad_norm) or any(is_dtensor(g) for g in grads):
            return None
        return torch.tensor(v.grad_norm, dtype=grads[0].dtype, device=grads[0].device)

    def logits_seen(self, module: torch.nn.Module, inputs: Any, output: Any) -> None:
        if self.inert or self.guard is None or not torch.is_grad_enabled() or \
                not module.training or not isinstance(output, torch.Tensor):
            return
        self.guard.accumulate(logits=output)

    # ---- verdicts -------------------------------------------------------

    def parameters(self) -> list[torch.Tensor]:
        seen: set[int] = set()
        out = []
        for ref in self.optimizers:
            opt = ref()
            if opt is None:
                continue
            for group in opt.param_groups:
                for p in group["params"]:
                    if id(p) not in seen:
                        seen.add(id(p))
                        out.append(p)
        return out

    def decide(self, opt: Any) -> Optional[Verdict]:
        """The verdict of the step now being taken: one per backward, shared
        by every optimizer that steps on it."""
        if self.inert:
            return None
        if self.verdict is not None and not self.fresh:
            return self.verdict
        if not self.started:
            self.judged_at = self.judged_at or "step"
            if not self.start(opt):
                return None
        guard = self.guard
        assert guard is not None
        loss = self.take_loss()
        shards, self.shards = self.shards, []
        guard.scaler = self.scaler
        try:
            v = guard.observe(self.step, loss, shards=shards or None)
        except TrainingHalted as e:  # persisting overflows: the scaler's skip raises
            v = e.verdict
        except Exception as e:
            self.detach(f"judging step {self.step} failed: {e}")
            return None
        self.step += 1
        self.verdict, self.fresh = v, False
        return v

    def take_loss(self) -> Optional[float]:
        plain, scaled, self.loss_sum, self.scaled_sum = self.loss_sum, self.scaled_sum, None, None
        self.micro_batches = 0
        if plain is None and scaled is None:
            return None
        total = 0.0 if plain is None else float(plain)
        if scaled is not None:
            total += float(scaled) / float(self.scaler.get_scale())
        return total

    def act(self, v: Verdict) -> bool:
        """Halts the process on a halt; True when the update is to be
        skipped. Observe-only, says what it would have done."""
        rank0 = self.rank == 0 and v is not self.acted
        self.acted = v
        if v.halt:
            if self.enforcing:
                self.halt(v)
            if rank0 and not self.would_have_halted:
                self.would_have_halted = True
                _say(f"would halt (observe-only): {TrainingHalted(v)}")
            return False
        if v.skip:
            what = "skipped the update of" if self.enforcing else "would skip (observe-only)"
            if rank0:
                _say(f"{what} step {v.step} (tier {v.tier}, {v.rule}): "
                     f"{' '.join((v.reason or '').split())}")
            return self.enforcing
        return False

    def halt(self, v: Verdict) -> None:
        self.record_halt(v)
        if self.agent is not None:
            self.agent.close(5000)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(3)

    def record_halt(self, v: Verdict) -> None:
        """The halt's one line, and its record for the launcher (its exit
        status, and no restart into the same failure)."""
        line = str(TrainingHalted(v))
        _say(line)
        record = os.path.join(self.state_dir, "halted") if self.state_dir else ""
        # Every rank halts; the record keeps a line naming a tensor, which
        # only the ranks that held it have.
        if record and (v.tensors or not os.path.exists(record)):
            try:
                with open(record, "w") as f:
                    f.write(line + "\n")
            except OSError as e:
                _say(f"could not record the halt for the launcher: {e}")

    def detach(self, why: str) -> None:
        _say(f"not attached: {why}")
        if self.agent is None:
            self.report_unwatched(why)
        if self.require:
            _say("stopping: trainwatch run --require")
            os._exit(2)
        self.inert = True
        self.first.stop()
        if self.agent is not None:
            self.agent.close(2000)
            self.agent = None

    def report_unwatched(self, why: str) -> None:
        """Tells trainwatchd, from the job's first rank, that the run trains
        unwatched and why: a hello alone, recorded with the run."""
        if int(os.environ.get("RANK", "0")) != 0:
            return
        try:
            agent = Agent(run_id=self.run_id(), observed=True, attachment=f"not attached: {why}")
            if agent.streaming:
                agent.wait_for_server(3.0)
            agent.close(2000)
        except Exception as e:  # the job goes on regardless
            _say(f"could not tell trainwatchd: {e}")

    # ---- the first verdict: what was found ---------------------------

    def start(self, opt: Any) -> bool:
        """Makes the Guard and the Agent at the first verdict, from what the
        first step showed; False (and detached) when this cannot be watched."""
        self.started = True
        self.first.stop()
        try:
            self.make_guard(opt)
        except Exception as e:
            self.detach(str(e))
            return False
        if self.explain:
            self.agent.close(2000)  # type: ignore[union-attr]
            sys.stdout.flush()
            os._exit(0)
        return True

    def make_guard(self, opt: Any) -> None:
        import torch.distributed as dist
        world, rank = 1, 0
        if dist.is_available() and dist.is_initialized():
            world, rank = dist.get_world_size(), dist.get_rank()
        elif int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise RuntimeError(f"WORLD_SIZE is {os.environ['WORLD_SIZE']} but torch.distributed "
                               "is not initialized at the first optimizer step")
        self.rank = rank
        params = self.parameters()
        names = self.first.parameter_names()
        named = [(names.get(id(p), f"param{i}"), p) for i, p in enumerate(params)]
        ddp = [m for m in (r() for r in self.ddp) if m is not None]
        model = next((m for m in ddp if any(p is q for p in m.parameters() for q in params[:1])),
                     None)
        layout_note = "one process"
        layout: Optional[str] = None
        if any(is_dtensor(p) for p in params):
            layout_note = "DTensor placements (FSDP2 / tensor parallel)"
        elif model is not None:
            layout_note = f"DDP (replicated on {world} ranks)"
        elif world > 1:
            if any(type(r).__name__ == "FullyShardedDataParallel" for r in self.first.roots):
                layout, layout_note = "sharded", f"FSDP (sharded over {world} ranks)"
            else:
                raise RuntimeError(f"{world} ranks, and the gradients' layout is unknown (no "
                                   "DistributedDataParallel, FSDP or DTensor parameters)")
        if any(type(r).__name__ == "DeepSpeedEngine" for r in self.first.roots):
            self.observe_reason = "DeepSpeed's engine clips and steps inside itself"
        self.enforcing = not self.observe_reason
        self.summary = self.describe(world, layout_note)
        self.agent = Agent(run_id=self.run_id(), rank=rank, world_size=world,
                           reduce=distributed_reduce() if world > 1 else None,
                           observed=not self.enforcing, attachment=self.summary_line())
        self.guard = Guard(opt, self.agent, params=named, model=model, layout=layout,
                           gate=False)
        self.guard.scaler = self.scaler
        self.step = self.resume_count(world)
        if self.first.logits is not None:
            self.first.logits[1].register_forward_hook(self.logits_seen)
        if rank == 0:
            _say("attached: " + self.summary_line())
        if not self.enforcing:
            _say(f"observe-only on rank {rank}: {self.observe_reason}")

    def summary_line(self) -> str:
        return "; ".join(f"{k}: {v}" for k, v in (self.summary or {}).items())

    def resume_count(self, world: int) -> int:
        """The step to count from: after the last one the server holds for
        this run (a restarted job goes on counting), else 0."""
        agent = self.agent
        assert agent is not None
        last = -1
        if agent.streaming and agent.wait_for_server(5.0):
            last = agent.stats().run_last_step
        if world > 1:
            last = int(distributed_reduce()([0.0], [float(last)])[1][0])
        return last + 1

    def describe(self, world: int, layout: str) -> dict[str, str]:
        opts = [o for o in (r() for r in self.optimizers) if o is not None]
        kinds = []
        for o in opts:
            d = getattr(o, "defaults", {})
            impl = "fused" if d.get("fused") else "foreach" if d.get("foreach") else ""
            kinds.append(type(o).__name__ + (f" ({impl})" if impl else ""))
        loss = "from backward()"
        if self.scaler is not None:
            loss += ", GradScaler's scale taken out"
        logits = "none (no [..., vocab] tensor in the model's output)"
        if self.first.logits is not None:
            name, _, vocab = self.first.logits
            logits = f"{name} (vocabulary {vocab}; from the second step)"
        shards = (f"from the batch field '{self.shard_field}'" if self.shard_field else
                  "none (no DataLoader batch field " + ", ".join(SHARD_FIELDS) + ")")
        mode = ("enforcing (skip and halt)" if self.enforcing else
                f"observe-only ({self.observe_reason})")
        return {
            "ranks": str(world),
            "optimizers": ", ".join(kinds) or "none",
            "grad norm": ("the trainer's clip call (before clipping)" if self.judged_at == "clip"
                          else "computed at optimizer.step() (no clip call seen)"),
            "loss": loss, "logits": logits, "layout": layout, "shards": shards, "mode": mode,
        }

