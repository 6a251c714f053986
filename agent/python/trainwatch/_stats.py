"""The gradient and logit statistics of trainwatch.torch's Guard: which path
reads a step's tensors (kernels/ on the host or on CUDA, or torch's own
operations as the fallback) and the torch-operation versions themselves.
Apart from torch.py so that the guard's file is the attach alone."""

from __future__ import annotations

import math as _math
import warnings as _warnings
from typing import Any, Optional, Sequence, Tuple, Union

import torch as _torch

from . import _trainwatch
from ._trainwatch import built_with_cuda as _BUILT_WITH_CUDA

# (name, sum of squares, nonfinite, elements) of one gradient.
TensorRow = Tuple[str, float, int, int]
# agent.step()'s gradient keywords, as Guard.observe() passes them.
GradKw = dict[str, Any]


def _DeviceStats() -> _trainwatch.DeviceStats:
    """kernels/' CUDA path (only in a CUDA build: built_with_cuda)."""
    return _trainwatch.DeviceStats()


# The dtypes kernels/ reads; any other takes torch operations.
_KERNEL_DTYPES = (_torch.float32, _torch.bfloat16, _torch.float16)
# Whether DeviceStats runs in this process: decided at its first use (a CUDA
# build can meet a driver older than its CUDA runtime, or no device).
_CUDA_KERNELS: Optional[bool] = None


def _cuda_kernels_usable() -> bool:
    global _CUDA_KERNELS
    if _CUDA_KERNELS is None:
        try:
            _DeviceStats()
            _CUDA_KERNELS = True
        except RuntimeError as e:
            _warnings.warn(f"trainwatch: the CUDA kernels cannot run here ({e}); statistics "
                           "of CUDA tensors use torch operations")
            _CUDA_KERNELS = False
    return _CUDA_KERNELS


def _fused_cuda(tensors: Sequence[_torch.Tensor]) -> bool:
    """Whether kernels/' CUDA path takes these tensors: a CUDA build, and
    every tensor on the current CUDA device in a dtype the kernels read."""
    if not _BUILT_WITH_CUDA or not tensors:
        return False
    if not all(t.is_cuda and t.dtype in _KERNEL_DTYPES for t in tensors):
        return False
    current = _torch.cuda.current_device()
    return all(t.device.index == current for t in tensors) and _cuda_kernels_usable()


def grad_stats(grads: Sequence[Optional[_torch.Tensor]], names: Optional[Sequence[str]] = None
               ) -> tuple[float, int, int, Optional[list[TensorRow]]]:
    """Gradient statistics with torch operations, on the tensors' own device.

    Returns (sum of squares over finite elements, nonfinite count, elements,
    per_tensor), per_tensor being None in a healthy step and otherwise a list
    of (name, sum of squares, nonfinite, elements). A healthy step costs one
    fused norm over all tensors and one host sync; the exact per-tensor count
    (in float64) runs only when the fused norm is not finite, which a NaN, an
    inf or a square beyond float range makes it.
    """
    named: Sequence[Optional[str]] = names if names is not None else [None] * len(grads)
    pairs = [(n, g) for n, g in zip(named, grads) if g is not None]
    per_tensor: list[TensorRow]
    elements = sum(g.numel() for _, g in pairs)
    if not pairs:
        return 0.0, 0, 0, None
    # torch's norm of a bf16 or fp16 tensor is rounded to that dtype (bf16:
    # 3 significant digits; fp16 overflows past 65504): those in float32.
    low = (_torch.bfloat16, _torch.float16)
    rest = [g for _, g in pairs if g.dtype not in low]
    norms = list(_torch._foreach_norm(rest)) if rest else []
    norms += [_torch.linalg.vector_norm(g, dtype=_torch.float32)
              for _, g in pairs if g.dtype in low]
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


def _grouped_grad_stats(grads: Sequence[_torch.Tensor], names: Optional[Sequence[str]],
                        copies: Sequence[int]
                        ) -> tuple[list[tuple[float, int, int, int]], Optional[list[TensorRow]]]:
    """grad_stats() per group of equal copies: ([(ss, nonfinite, elements,
    copies), ...], per_tensor or None), for the binding's grad_stats."""
    groups: list[tuple[float, int, int, int]] = []
    per_tensor: Optional[list[TensorRow]] = None
    for c in sorted(set(copies)):
        idx = [i for i, k in enumerate(copies) if k == c]
        ss, bad, n, pt = grad_stats([grads[i] for i in idx],
                                    None if names is None else [names[i] for i in idx])
        groups.append((ss, bad, n, c))
        if pt is not None:
            per_tensor = (per_tensor or []) + pt
    return groups, per_tensor


def _kernel_grad_kw(r: _trainwatch.DeviceStatsResult, names: Optional[Sequence[str]],
                    copies: Union[int, Sequence[int], None]) -> GradKw:
    """agent.step()'s grad_stats (and grad_tensors) from DeviceStats.finish()'s
    result r, in the forms grad_stats() and _grouped_grad_stats() give."""
    ss, bad, n = r["sum_squares"], r["nonfinite"], r["elements"]
    kw: GradKw = {}
    if copies is None:
        kw["grad_stats"] = (ss, bad, n)
    elif isinstance(copies, int):
        kw["grad_stats"] = [(ss, bad, n, copies)]
    else:
        groups: dict[int, list[Any]] = {}
        for c, t_ss, t_bad, t_n in zip(copies, r["tensor_sum_squares"], r["tensor_nonfinite"],
                                       r["tensor_elements"]):
            g = groups.setdefault(c, [0.0, 0, 0])
            g[0] += t_ss
            g[1] += t_bad
            g[2] += t_n
        kw["grad_stats"] = [(g[0], g[1], g[2], c) for c, g in sorted(groups.items())]
    if bad and names is not None:
        kw["grad_tensors"] = list(zip(names, r["tensor_sum_squares"], r["tensor_nonfinite"],
                                      r["tensor_elements"]))
    return kw


def _device_log_z_sum(logits: _torch.Tensor, labels: Optional[_torch.Tensor] = None,
                      ignore_index: int = -100) -> tuple[_torch.Tensor, int]:
    """(sum of log Z over counted rows, rows) as tensors on the logits'
    device, log Z in float32 and the sum in float64: no host sync, so
    micro-batches add up on the device and cross to the host once."""
    lz = _torch.logsumexp(logits.reshape(-1, logits.shape[-1]).float(), dim=-1)
    if labels is not None:
        lz = lz[labels.reshape(-1).to(lz.device) != ignore_index]
    return lz.double().sum(), lz.numel()


def log_z_stats(logits: _torch.Tensor, labels: Optional[_torch.Tensor] = None,
                ignore_index: int = -100) -> Optional[float]:
    """Mean log partition function over the rows of [..., vocab] logits (rows
    whose label is ignore_index left out), computed on the logits' device in
    float32; NaN when any counted row's log Z is not finite, None without
    rows."""
    total, rows = _device_log_z_sum(logits, labels, ignore_index)
    if rows == 0:
        return None
    mean = float(total) / rows
    return mean if _math.isfinite(mean) else _math.nan



def _nonfinite_norm(grads: Sequence[_torch.Tensor]) -> float:
    """This rank's total 2-norm as torch.nn.utils.clip_grad_norm_ computes
    it (inf, or NaN where a NaN is), for a step whose global count found a
    nonfinite element; NaN where this rank's own gradients are all finite
    (another rank holds it: which of the two is not known here)."""
    norm = float(_torch.norm(_torch.stack([_torch.norm(g, 2.0).to(grads[0].device)
                                           for g in grads]), 2.0))
    return norm if not _math.isfinite(norm) else _math.nan
