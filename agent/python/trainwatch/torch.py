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

    optimizer.zero_grad()
    for micro in range(accum):
        logits = model(x[micro])
        loss = loss_fn(logits, y[micro])
        (loss / accum).backward()
        guard.accumulate(loss, logits=logits, labels=y[micro], shards=ids[micro],
                         ignore_index=-1)
    guard.observe(step)
    optimizer.step()

Host tensors are read in place by the package's statistics kernels. CUDA
tensors in float32, bfloat16 or float16 go through the same kernels' CUDA
versions when the package was built with CUDA (trainwatch._trainwatch.built_with_cuda):
one pass over the gradients and one over each micro-batch's logits, on
torch.cuda.current_stream(), and one small copy of the numbers (gradients,
log Z and loss together) to the host per optimizer step, in observe(). That
one wait is needed because the verdict is acted on by the host, before
optimizer.step(). Without a CUDA build, for other dtypes and for tensors on
other devices, torch's own operations reduce them on their device
(grad_stats() and log_z_stats()). Guard.stats_path says which ran last:
"host", "cuda" or "torch". With a GradScaler, the scaler's own reads of
found_inf and the scale add theirs (its step() waits for found_inf anyway).

Gradient layout (watch(layout=...)): with several ranks the agent must know
how many ranks hold each gradient, or the global norm is wrong (DDP counted
as sharded is sqrt(world_size) times too large):

- "replicated": DDP, every rank holds the same all-reduced gradients. The
  default when watch(model=) is a DistributedDataParallel.
- "sharded": FSDP, ZeRO; each rank holds its own slice. The default for a
  FullyShardedDataParallel model, and for one rank.
- "hybrid": tensor/pipeline-parallel shards within a model-parallel group,
  replicated across data_parallel_size ranks. Parameters marked as
  tensor-parallel shards (Megatron-LM's ``tensor_model_parallel`` attribute;
  mark_tensor_parallel() sets it) count once per data-parallel replica;
  everything unmarked (norms, biases) is taken as duplicated on the
  tensor_parallel_size ranks of the group and counted once.

DTensor parameters (torch 2.x: FSDP2's fully_shard, tensor parallel, HSDP)
need none of these: each gradient's placements say how many ranks hold it
(_placements.py), its local shard is read, and replicas= gives any copies
outside the device mesh (DDP around a tensor-parallel mesh); guard.layout is
then "dtensor". With several ranks and none of these known, watch() raises
ValueError rather than report a wrong norm. Loss and log Z are means over the ranks that report
them (log Z weighted by rows) in every layout; every tensor-parallel rank of
a replica reports the same loss, which leaves the mean unchanged.

Where a nonfinite gradient can be localised: sharded, only the rank holding
the shard sees it, and that rank's record names it and the tensor; after
DDP's all-reduce every rank sees the same NaN, so the record names the
tensor but cannot say which rank's backward produced it.

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

Gradient clipping: the verdict's grad_norm is already the global norm before
clipping, so guard.clip_grad_norm_(max_norm) in place of
torch.nn.utils.clip_grad_norm_ clips with it instead of taking the norm a
second time (the same gradients and return value as torch's, in every
layout; statistics plus clip cost about what torch's clip alone does,
bench/agent/clip_overhead.py)::

    guard.observe(step, loss)      # with a scaler: after scaler.unscale_, or it unscales
    guard.clip_grad_norm_(1.0)
    optimizer.step()               # or scaler.step(optimizer)
"""

from __future__ import annotations

import enum as _enum
import math as _math
import weakref as _weakref
from types import TracebackType
from typing import (TYPE_CHECKING, Any, Callable, Iterable, Literal, Optional, Tuple, Union,
                    cast as _cast)

import torch as _torch

from . import Agent, Reduce, Shard, TrainingHalted, Verdict
from . import exit_on_halt  # noqa: F401  (trainwatch.torch.exit_on_halt, for trainers)
from ._trainwatch import log_z_sum as _host_log_z_sum
from ._placements import DTensorLayout as _DTensorLayout, is_dtensor as _is_dtensor, \
    local as _local
# The statistics themselves, by kernels/ or by torch operations (_stats.py).
from ._stats import (GradKw as _GradKw, grad_stats, log_z_stats, _DeviceStats,  # noqa: F401
                     _device_log_z_sum, _fused_cuda, _grouped_grad_stats, _kernel_grad_kw,
                     _nonfinite_norm)

if TYPE_CHECKING:
    from torch.amp import GradScaler

    from . import _trainwatch

__all__ = ["watch", "Guard", "Layout", "StatsPath", "distributed_reduce", "grad_stats",
           "log_z_stats", "mark_tensor_parallel", "LAYOUTS", "exit_on_halt"]


class Layout(str, _enum.Enum):
    """How the ranks hold the gradients (the module's docstring says more).
    A str enum: watch(layout="hybrid") and guard.layout == "hybrid" hold.
    DTENSOR is guard.layout for DTensor parameters, never given."""

    REPLICATED = "replicated"
    SHARDED = "sharded"
    HYBRID = "hybrid"
    DTENSOR = "dtensor"

    def __str__(self) -> str:
        return self.value


# The layouts watch(layout=) takes.
LAYOUTS = (Layout.REPLICATED, Layout.SHARDED, Layout.HYBRID)

# Which statistics path read the last step: kernels/ on the host or on CUDA,
# or torch operations.
StatsPath = Literal["host", "cuda", "torch"]

# watch()'s params: tensors, or (name, tensor) pairs that name a NaN's tensor.
Params = Union[Iterable[_torch.Tensor], Iterable[Tuple[str, _torch.Tensor]]]
# How many ranks hold each gradient: None (each rank its own shard), an int
# for all, or a function of the parameter (and its name).
_Copies = Union[None, int, Callable[[_torch.Tensor, Optional[str]], int]]
# A watched parameter: (its name, or None when unnamed; the parameter).
_Watched = list[tuple[Optional[str], _torch.Tensor]]
# (parameter, its gradient, the gradient's version) at observe().
_Observed = list[tuple[_torch.Tensor, "_weakref.ReferenceType[_torch.Tensor]", int]]


def mark_tensor_parallel(*params: _torch.Tensor) -> None:
    """Marks parameters as tensor-parallel shards (each tensor-parallel rank
    holds a different slice), as Megatron-LM's tensor_model_parallel
    attribute does, for watch(layout="hybrid")."""
    for p in params:
        setattr(p, "tensor_model_parallel", True)


class Guard:
    """Holds the latest verdict and gates the wrapped optimizer's step()."""

    def __init__(self, optimizer: _torch.optim.Optimizer, agent: Agent,
                 params: Optional[Params] = None, on_device: bool = False,
                 model: Optional[_torch.nn.Module] = None,
                 layout: Union[Layout, str, None] = None,
                 data_parallel_size: Optional[int] = None,
                 tensor_parallel_size: Optional[int] = None,
                 scaler: Optional[GradScaler] = None, replicas: Optional[int] = None,
                 gate: bool = True) -> None:
        self.optimizer = optimizer
        self.agent = agent
        self.scaler = scaler
        if params is None and model is not None:
            params = model.named_parameters()
        given: Optional[list[Any]] = list(params) if params is not None else None
        self.params = given
        # Named when the parameters are (watch(..., params=model.named_parameters())):
        # a NaN is then reported with the tensor that holds it.
        self._named = given is not None and len(given) > 0 and isinstance(given[0], tuple)
        self._copies: _Copies
        self.layout: Layout
        watched = self._watched()
        if any(_is_dtensor(p) for _, p in watched):
            # FSDP2, tensor parallel, HSDP: each gradient's placements say
            # how many ranks hold it (_placements.py); nothing to set by hand.
            if layout is not None or data_parallel_size is not None or \
                    tensor_parallel_size is not None:
                raise ValueError("watch(): the parameters are DTensors, whose placements give "
                                 "the layout: leave layout, data_parallel_size and "
                                 "tensor_parallel_size out (replicas= for copies outside the mesh)")
            self.layout = Layout.DTENSOR
            self._copies = _DTensorLayout(watched, agent.world_size, replicas)
        else:
            if replicas is not None:
                raise ValueError("watch(): replicas is for DTensor parameters (copies outside "
                                 "their mesh); plain tensors take layout=")
            self.layout = _resolve_layout(agent, model, layout)
            self._copies = _layout_copies(self.layout, agent.world_size, data_parallel_size,
                                          tensor_parallel_size)
        # Statistics with torch operations even for host tensors (CUDA
        # tensors take the CUDA kernels where the build has them).
        self.on_device = on_device
        self._grads_on_device: Optional[bool] = None
        # kernels/' CUDA path, made at first use
        self._device_stats: Optional[_trainwatch.DeviceStats] = None
        self.stats_path: Optional[StatsPath] = None  # the last step's
        self.verdict: Optional[Verdict] = None
        self.skipped = 0
        # The gradients the verdict's norm is of (set by observe(), emptied
        # once clipped or stepped): clip_grad_norm_()'s guard against misuse.
        self._observed: Optional[_Observed] = None
        self._losses = 0
        self._loss_sum: Union[float, _torch.Tensor] = 0.0
        self._log_z_sum: Union[float, _torch.Tensor] = 0.0
        self._log_z_rows = 0
        self._shards: list[Shard] = []
        # gate=False: the caller acts on the verdict itself (the trainer
        # integrations, which decide inside the trainer's own step, where
        # wrapping optimizer.step would come after the trainer's clip).
        self._step = optimizer.step
        if gate:
            setattr(optimizer, "step", self._gated_step)

    def _clear_micro_batches(self) -> None:
        # The optimizer step being accumulated: the losses' sum (a float, or
        # a device tensor until observe()), log Z's sum and rows, the shards.
        self._losses, self._loss_sum = 0, 0.0
        self._log_z_sum, self._log_z_rows = 0.0, 0
        self._shards = []

    def _watched(self) -> _Watched:
        """(name or None, parameter) for each parameter whose gradient counts:
        watch()'s params, else the optimizer's (read each step: a param group
        may be added while training)."""
        if self._named:
            return _cast(_Watched, self.params)
        params = self.params
        if params is None:
            params = [p for g in self.optimizer.param_groups for p in g["params"]]
        return [(None, p) for p in params]

    def _grads(self) -> tuple[Union[list[_torch.Tensor], dict[str, _torch.Tensor]],
                              Union[None, int, list[int]], _Observed]:
        """The gradients (a dict when named), the copies of each (a list, an
        int for all, or None: sharded), and what clip_grad_norm_() checks.
        DTensor gradients are given as this rank's local tensors."""
        watched = [(n, p) for n, p in self._watched() if p.grad is not None]
        params = [p for _, p in watched]
        grads = [_local(_grad(p).detach()).contiguous() for p in params]
        # What clip_grad_norm_() may scale: these very gradients, unchanged.
        # Weak references, so that a zero_grad(set_to_none=True) still frees
        # them; the version counter moves with every in-place change (of the
        # local tensor, for a DTensor: the one clip_grad_norm_ scales; read
        # from p.grad itself, as a detached FSDP2 gradient's counter is not it).
        observed: _Observed = [(p, _weakref.ref(_grad(p)), _local(_grad(p))._version)
                               for p in params]
        given: Union[list[_torch.Tensor], dict[str, _torch.Tensor]] = grads
        if self._named:
            given = {str(n): g for (n, _), g in zip(watched, grads)}
        copies = self._copies
        if callable(copies):
            return given, [copies(p, n) for n, p in watched], observed
        return given, copies, observed

    @_torch.no_grad()
    def accumulate(self, loss: Union[_torch.Tensor, float, None] = None,
                   logits: Optional[_torch.Tensor] = None, labels: Optional[_torch.Tensor] = None,
                   shards: Optional[Iterable[Shard]] = None, ignore_index: int = -100) -> None:
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
            if _fused_cuda([logits]):
                # Enqueued on the stream; the sum crosses to the host in observe().
                lab = None if labels is None else labels.reshape(-1).to(
                    device=logits.device, dtype=_torch.int32)
                self._cuda_stats().add_logits(
                    logits.reshape(-1, logits.shape[-1]).contiguous(), lab, int(ignore_index),
                    _torch.cuda.current_stream().cuda_stream)
                total: Union[float, _torch.Tensor] = 0.0
                rows = 0
            elif self.on_device or logits.device.type != "cpu":
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
    def __enter__(self) -> Guard:
        return self

    def __exit__(self, exc_type: Optional[type[BaseException]],
                 exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        """`with watch(...) as guard:` closes the agent at the end, its
        records flushed to the server, whether the loop ended or raised."""
        self.agent.close()

    def observe(self, step: int, loss: Union[_torch.Tensor, float, None] = None,
                logits: Optional[_torch.Tensor] = None, labels: Optional[_torch.Tensor] = None,
                shards: Optional[Iterable[Shard]] = None, ignore_index: int = -100) -> Verdict:
        """Statistics of this optimizer step (grads before clipping), and the
        verdict. With loss, logits, labels or shards given, they are one more
        micro-batch (see accumulate()); a loop without accumulation gives
        them here and never calls accumulate()."""
        if loss is not None or logits is not None or labels is not None or shards is not None:
            self.accumulate(loss, logits=logits, labels=labels, shards=shards,
                            ignore_index=ignore_index)
        losses, loss_sum = self._losses, self._loss_sum
        log_z_sum, log_z_rows = self._log_z_sum, self._log_z_rows
        shards = self._shards or None
        self._clear_micro_batches()
        group = self.optimizer.param_groups[0]
        z = group.get("z_loss_alpha")
        kw = self._loss_scale()
        self._observed = None  # until this step's verdict is in
        grads, copies, observed = self._grads()
        tensors = list(grads.values()) if isinstance(grads, dict) else grads
        names = list(grads.keys()) if isinstance(grads, dict) else None
        if self._grads_on_device is None and tensors:
            # Parameters do not change devices while training: decided once.
            self._grads_on_device = any(g.device.type != "cpu" for g in tensors)
        fused = bool(self._grads_on_device) and _fused_cuda(tensors)
        dev = self._device_stats
        if fused or (dev is not None and dev.pending_logits):
            # Gradients, the micro-batches' log Z and the loss: the step's
            # one copy to the host (DeviceStats.finish).
            on_dev = (loss_sum if isinstance(loss_sum, _torch.Tensor) and loss_sum.is_cuda
                      and loss_sum.dtype == _torch.float64
                      and loss_sum.device.index == _torch.cuda.current_device() else None)
            by_tensor = names is not None or isinstance(copies, list)
            r = self._cuda_stats().finish(
                tensors if fused else [], _torch.cuda.current_stream().cuda_stream,
                fused and by_tensor, on_dev.reshape(1) if on_dev is not None else None)
            if on_dev is not None:
                loss_sum = _cast(float, r["loss"])  # given, so returned
            if r["log_z_rows"]:
                # A counted row whose log Z is not finite makes the sum NaN.
                log_z_sum = log_z_sum + (r["log_z_sum"] if r["log_z_nonfinite_rows"] == 0
                                         else _math.nan)
                log_z_rows += r["log_z_rows"]
        loss_value = float(loss_sum) / losses if losses else None
        log_z = None
        if log_z_rows:
            total = float(log_z_sum)
            # Any counted row whose log Z is not finite makes the step's NaN.
            log_z = (total if _math.isfinite(total) else _math.nan, log_z_rows)
        if fused:
            self.stats_path = "cuda"
            kw.update(_kernel_grad_kw(r, names, copies))
        elif self.on_device or self._grads_on_device:
            self.stats_path = "torch"
            if copies is None:
                ss, bad, n, per_tensor = grad_stats(tensors, names)
                kw["grad_stats"] = (ss, bad, n)
            else:
                if isinstance(copies, int):
                    copies = [copies] * len(tensors)
                kw["grad_stats"], per_tensor = _grouped_grad_stats(tensors, names, copies)
            if per_tensor is not None and names is not None:
                kw["grad_tensors"] = per_tensor
        else:
            self.stats_path = "host"
            kw["grads"] = grads
            kw["grad_copies"] = copies
        self.verdict = self.agent.step(
            int(step), loss=loss_value, log_z_sum=log_z, shards=shards,
            lr=float(group["lr"]), z_loss_alpha=None if z is None else float(z), **kw)
        self._observed = observed
        if self.verdict.halt and kw.get("loss_scale_overflow"):
            # The scaler skips optimizer.step() on an overflow step, so the
            # gated step would never see this halt (overflows persisting).
            raise TrainingHalted(self.verdict)
        return self.verdict

    @_torch.no_grad()
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0,
                        error_if_nonfinite: bool = False) -> _torch.Tensor:
        """torch.nn.utils.clip_grad_norm_ on the gradients observe() just
        judged, without a second norm pass: the verdict's grad_norm is their
        global norm before clipping, so this only scales them, by torch's
        coefficient min(1, max_norm / (norm + 1e-6)), and returns the norm as
        torch does (a tensor of the gradients' dtype, on their device)::

            loss.backward()
            guard.observe(step, loss)
            guard.clip_grad_norm_(1.0)   # instead of torch's, same result
            optimizer.step()

        The norm is the layout's global one (watch(layout=)), the same on
        every rank: under DDP that of the replicated gradients; sharded
        (FSDP, ZeRO), the norm over every rank's shard, which is exactly what
        FullyShardedDataParallel.clip_grad_norm_ all-reduces, so each rank
        scaling its own shard by it clips the whole model; hybrid, every
        parameter counted once, as Megatron-LM's clip counts them. With a
        GradScaler the gradients are unscaled before observe() (it unscales
        them itself unless the trainer did), so this clips unscaled
        gradients, as torch's clip after scaler.unscale_(optimizer) does.
        The gradients scaled are those watch() observes (its params, or the
        optimizer's).

        Only the 2-norm (the verdict's); norm_type is there to refuse others.
        A step holding a NaN or inf gradient has no finite norm: the exact
        local norm is then taken as torch takes it (NaN or inf; on a rank
        whose own gradients are finite while another rank's are not, NaN),
        error_if_nonfinite raises as torch does, and a skip or halt verdict
        leaves the gradients unscaled (the update never happens; torch would
        multiply them by NaN). A continue verdict with a nonfinite norm (an
        fp16 overflow the scaler skips, say) scales as torch does.

        Raises RuntimeError when called before this step's observe(), twice,
        after optimizer.step(), or when the gradients changed since
        observe() (another backward, an unscale_ after it, an edit in
        place): the verdict's norm would not be theirs.
        """
        if float(norm_type) != 2.0:
            raise ValueError(f"clip_grad_norm_: norm_type {norm_type!r}: only the 2-norm the "
                             "verdict carries (use torch.nn.utils.clip_grad_norm_ for others)")
        max_norm = float(max_norm)
        if not max_norm >= 0.0:
            raise ValueError(f"clip_grad_norm_: max_norm must be >= 0 (got {max_norm!r})")
        observed, v = self._observed, self.verdict
        if observed is None or v is None:
            raise RuntimeError("clip_grad_norm_() needs this step's observe() first (and at "
                               "most one clip per observe(), before optimizer.step())")
        grads = []
        for p, ref, version in observed:
            g = ref()
            if g is None or p.grad is not g or _local(g)._version != version:
                raise RuntimeError(
                    "clip_grad_norm_(): the gradients changed after observe() (another "
                    "backward, zero_grad, scaler.unscale_ or an in-place edit): the verdict's "
                    "norm is not theirs; call observe() after the last change")
            grads.append(_local(g))
        if not grads:
            self._observed = None
            return _torch.tensor(0.0)  # as torch, for no gradients
        norm = v.grad_norm
        if v.nan_frac > 0 or not _math.isfinite(norm):
            norm = _nonfinite_norm(grads)
            if error_if_nonfinite:
                # Nothing consumed: a retry with error_if_nonfinite=False works.
                raise RuntimeError(
                    f"clip_grad_norm_: the total norm of the gradients is {norm} (verdict "
                    f"{v.decision}, nan_frac {v.nan_frac:.3g}), so it cannot be clipped; set "
                    "error_if_nonfinite=False to scale them by the non-finite norm anyway")
        self._observed = None  # one clip per observe()
        total = _torch.tensor(norm, dtype=grads[0].dtype, device=grads[0].device)
        if v.skip or v.halt:
            return total  # the gated step drops them (skip) or raises (halt)
        coef = max_norm / (norm + 1e-6)
        # torch multiplies by a clamped coefficient of 1 too, only to avoid a
        # host sync; here the norm is on the host already, so that pass goes.
        if not coef >= 1.0:  # NaN included, as torch's clamp keeps it
            _torch._foreach_mul_(grads, coef)
        return total

    def _cuda_stats(self) -> _trainwatch.DeviceStats:
        if self._device_stats is None:
            self._device_stats = _DeviceStats()
        return self._device_stats

    def _loss_scale(self) -> _GradKw:
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

    def _gated_step(self, *args: Any, **kwargs: Any) -> Any:
        v = self.verdict
        self.verdict = None
        self._observed = None
        if v is not None and v.halt:
            raise TrainingHalted(v)
        if v is not None and v.skip:
            # The backward ran (its norm is known); the update does not.
            self.optimizer.zero_grad(set_to_none=True)
            self.skipped += 1
            return None
        return self._step(*args, **kwargs)

    def resume_from(self, step: int) -> None:
        """After loading the checkpoint of `step` in a rollback."""
        self.verdict = None
        self._observed = None
        self._clear_micro_batches()  # micro-batches of an abandoned step
        if self._device_stats is not None:
            self._device_stats.discard()
        self.agent.resume_from(int(step))

    def detach(self) -> None:
        """Gives the optimizer its own step() back."""
        if self.optimizer.step == self._gated_step:
            setattr(self.optimizer, "step", self._step)


def _grad(p: _torch.Tensor) -> _torch.Tensor:
    """p.grad, which the caller has seen is set."""
    g = p.grad
    assert g is not None
    return g


def _resolve_layout(agent: Agent, model: Optional[_torch.nn.Module],
                    layout: Union[Layout, str, None]) -> Layout:
    if layout is not None:
        if layout not in LAYOUTS:
            raise ValueError(f"watch(): layout {layout!r} is not one of {', '.join(LAYOUTS)}")
        return Layout(layout)
    if isinstance(model, _torch.nn.parallel.DistributedDataParallel):
        return Layout.REPLICATED
    # By name: torch 1.13's FSDP module does not import on every Python.
    if type(model).__name__ == "FullyShardedDataParallel":
        return Layout.SHARDED
    if agent.world_size == 1:
        return Layout.SHARDED  # one rank: every layout is the same
    raise ValueError(
        f"watch(): with world_size {agent.world_size} the gradient layout is needed: pass "
        "model= a DistributedDataParallel or FullyShardedDataParallel, or layout="
        "'replicated' (DDP), 'sharded' (FSDP/ZeRO) or 'hybrid' (tensor x data parallel)")


def _layout_copies(layout: Layout, world: int, dp: Optional[int], tp: Optional[int]) -> _Copies:
    """How many ranks hold each gradient: None (sharded: 1, the binding's
    default), an int for all, or a function of the parameter."""
    if layout is not Layout.HYBRID:
        if dp is not None or tp is not None:
            raise ValueError("watch(): data_parallel_size and tensor_parallel_size are for "
                             "layout='hybrid'")
        return None if layout is Layout.SHARDED else world
    for name, v in (("data_parallel_size", dp), ("tensor_parallel_size", tp)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"watch(): layout='hybrid' needs {name}, an int >= 1 (got {v!r})")
    assert dp is not None and tp is not None  # checked just above
    if world % (dp * tp) != 0:
        raise ValueError(f"watch(): data_parallel_size {dp} x tensor_parallel_size {tp} does "
                         f"not divide world_size {world}")

    # A tensor-parallel shard is held by its data-parallel replicas; an
    # unmarked parameter also by every tensor-parallel rank of the group.
    def copies(p: _torch.Tensor, name: Optional[str] = None) -> int:
        return dp if getattr(p, "tensor_model_parallel", False) else dp * tp
    return copies


def watch(optimizer: _torch.optim.Optimizer, agent: Agent, params: Optional[Params] = None,
          on_device: bool = False, model: Optional[_torch.nn.Module] = None,
          layout: Union[Layout, str, None] = None, data_parallel_size: Optional[int] = None,
          tensor_parallel_size: Optional[int] = None, scaler: Optional[GradScaler] = None,
          replicas: Optional[int] = None) -> Guard:
    """Wraps `optimizer` so that its step() obeys the agent's verdicts.

    params: the parameters whose gradients count (default: model's named
    parameters when model is given, else the optimizer's);
    model.named_parameters() also names the tensor behind a NaN.
    on_device: compute statistics with torch operations even for host
    tensors (CUDA tensors take the CUDA kernels in a CUDA build, torch
    operations otherwise).
    model: the trained module; a DistributedDataParallel makes the layout
    "replicated", a FullyShardedDataParallel "sharded".
    layout: "replicated", "sharded" or "hybrid" (see the module's docstring);
    needed with world_size > 1 unless model tells it.
    data_parallel_size, tensor_parallel_size: for "hybrid" only, both
    required; their product divides world_size (the rest: pipeline stages).
    Parameters that are tensor-parallel shards carry tensor_model_parallel
    (Megatron-LM sets it; else mark_tensor_parallel()).
    scaler: the fp16 run's torch.cuda.amp.GradScaler: statistics of the
    unscaled gradients, and its scale and overflows in the record.
    replicas: with DTensor parameters (whose placements give the layout),
    the copies held outside their device mesh, e.g. the data-parallel size
    of DDP around a tensor-parallel mesh; needed when the mesh does not span
    every rank (1 when the other ranks hold other parameters)."""
    return Guard(optimizer, agent, params, on_device, model, layout, data_parallel_size,
                 tensor_parallel_size, scaler, replicas)


_exit_hold_registered = False


def _hold_exit_for_collectives() -> None:
    """A collective's tensors are released by the process group's own worker
    thread after the caller's wait returns (gloo's runLoop), which takes the
    GIL to drop their Python objects. If the interpreter is finalizing by
    then, that thread is ended from inside C++ and the process aborts
    ("terminate called without an active exception"; seen at the exit of a
    job whose last act was the agent's reduction, on a loaded machine). At
    exit, before finalizing, the GIL is let go for a moment so that they can
    finish."""
    global _exit_hold_registered
    if not _exit_hold_registered:
        import atexit
        import time
        atexit.register(time.sleep, 0.2)
        _exit_hold_registered = True


def distributed_reduce(group: Any = None) -> Reduce:
    """A reduce callable for trainwatch.Agent over torch.distributed.

    group: every rank of the job (default: the whole world), whatever the
    layout: one all-reduce over all of them makes the norm exact, each rank
    weighting its gradients by their copies (watch(layout=)). The agent's
    world_size must be this group's size."""
    import torch.distributed as dist
    _hold_exit_for_collectives()

    def reduce(sums: list[float], maxes: list[float]) -> tuple[list[float], list[float]]:
        # NCCL reduces device tensors only; gloo and MPI host ones.
        device: Union[str, _torch.device] = "cpu"
        if dist.get_backend(group) == "nccl":
            device = _torch.device("cuda", _torch.cuda.current_device())
        s = _torch.tensor(sums, dtype=_torch.float64, device=device)
        m = _torch.tensor(maxes, dtype=_torch.float64, device=device)
        dist.all_reduce(s, op=dist.ReduceOp.SUM, group=group)
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        return s.tolist(), m.tolist()

    return reduce
