#!/usr/bin/env python3
"""GPU grad stats next to PyTorch, on the same gradient tensors.

Per step, what a trainer needs before optimizer.step(): the global grad norm
and the number of nonfinite gradient elements, read on the host.

  torch:      torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
              plus the nonfinite count, (~isfinite(g)).sum() per tensor,
              summed, and both read with .item()
  torch norm: the norm alone, without the clipping multiply
              (torch._foreach_norm + vector_norm), plus the same count
  trainwatch: GradStatsGpuPlan launch (2 kernels) + read-back + sync, through
              the C ABI (libtrainwatch_kernels_c.so) on torch's current stream

Times are medians of wall-clock steps (each ends in a host sync), after a
warm-up. The goal: trainwatch >= 2x faster than the torch line. The results
are checked against each other, and the nonfinite count on gradients with
injected NaN / inf against torch's.

  python3 bench/kernels/grad_stats_vs_torch.py [--lib PATH] [--steps 30]
"""

import argparse
import ctypes
import os
import statistics
import sys
import time

import torch

DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


class TwGradStats(ctypes.Structure):
    _fields_ = [("sum_squares", ctypes.c_double), ("nonfinite", ctypes.c_int64),
                ("numel", ctypes.c_int64), ("max_abs", ctypes.c_double)]


def find_lib(explicit):
    if explicit:
        return explicit
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    for c in (os.environ.get("TRAINWATCH_KERNELS_LIB", ""),
              os.path.join(root, "build", "gpu-check", "lib", "libtrainwatch_kernels_c.so"),
              os.path.join(root, "build", "lib", "libtrainwatch_kernels_c.so")):
        if c and os.path.exists(c):
            return c
    sys.exit("libtrainwatch_kernels_c.so not found; pass --lib PATH")


class Plan:
    """A GradStatsGpuPlan over a list of CUDA tensors, through the C ABI."""

    def __init__(self, lib, tensors):
        self.lib = lib
        n = len(tensors)
        data = (ctypes.c_void_p * n)(*[t.data_ptr() for t in tensors])
        dtypes = (ctypes.c_int32 * n)(*[DTYPES[t.dtype] for t in tensors])
        numels = (ctypes.c_int64 * n)(*[t.numel() for t in tensors])
        self.handle = ctypes.c_void_p()
        self._check(lib.tw_kernels_gpu_plan_create(data, dtypes, numels, n, 0,
                                                   ctypes.byref(self.handle)))
        self.out = TwGradStats()

    def _check(self, rc):
        if rc != 0:
            raise RuntimeError(self.lib.tw_kernels_last_error().decode())

    def step(self, stream):
        """Launch, read back, synchronize: the trainer's whole cost."""
        self._check(self.lib.tw_kernels_gpu_plan_launch(self.handle, stream))
        self._check(self.lib.tw_kernels_gpu_plan_readback(self.handle, stream))
        torch.cuda.current_stream().synchronize()
        self._check(self.lib.tw_kernels_gpu_plan_result(self.handle, ctypes.byref(self.out),
                                                        None, None, None))
        return self.out.sum_squares ** 0.5, self.out.nonfinite

    def __del__(self):
        if getattr(self, "handle", None):
            self.lib.tw_kernels_gpu_plan_destroy(self.handle)


def load(path):
    lib = ctypes.CDLL(path)
    vp, i32p, i64p = ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int64)
    lib.tw_kernels_gpu_plan_create.argtypes = [ctypes.POINTER(vp), i32p, i64p, ctypes.c_int64,
                                               ctypes.c_int32, ctypes.POINTER(vp)]
    lib.tw_kernels_gpu_plan_launch.argtypes = [vp, vp]
    lib.tw_kernels_gpu_plan_readback.argtypes = [vp, vp]
    lib.tw_kernels_gpu_plan_result.argtypes = [vp, ctypes.POINTER(TwGradStats), vp, vp, vp]
    lib.tw_kernels_gpu_plan_destroy.argtypes = [vp]
    lib.tw_kernels_last_error.restype = ctypes.c_char_p
    if not lib.tw_kernels_has_cuda():
        sys.exit("the library was built without CUDA")
    return lib


def nonfinite_count(grads):
    return torch.stack([(~torch.isfinite(g)).sum() for g in grads]).sum()


def torch_clip_step(params, grads):
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm=1e30, foreach=True)
    bad = nonfinite_count(grads)
    return float(norm.item()), int(bad.item())


def torch_norm_step(params, grads):
    norms = torch._foreach_norm(grads, 2)
    norm = torch.linalg.vector_norm(torch.stack([n.float() for n in norms]), 2)
    bad = nonfinite_count(grads)
    return float(norm.item()), int(bad.item())


def median_ms(fn, steps, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def make_case(name, sizes, dtype):
    params = []
    for n in sizes:
        p = torch.nn.Parameter(torch.empty(n, dtype=dtype, device="cuda"))
        p.grad = (torch.randn(n, device="cuda") * 1e-3).to(dtype)
        params.append(p)
    return name, params


def llm_like_sizes(layers=12, d=2048, ff=5504, vocab=32000):
    sizes = [vocab * d]
    for _ in range(layers):
        sizes += [d, d * d, d * d, d * d, d * d, d, d * ff, d * ff, ff * d]
    return sizes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default="")
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch has no CUDA device: nothing to compare")
        return 0
    lib = load(find_lib(args.lib))
    torch.manual_seed(0)
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    g = torch.Generator().manual_seed(1)
    small = [int(x) for x in torch.randint(1, 8192, (1000,), generator=g)]
    cases = [make_case("LLM-like, 12 layers, bf16", llm_like_sizes(), torch.bfloat16),
             make_case("1,000 small tensors, bf16", small, torch.bfloat16),
             make_case("LLM-like, 12 layers, fp32", llm_like_sizes(layers=6), torch.float32)]
    ok = True
    for name, params in cases:
        grads = [p.grad for p in params]
        total = sum(t.numel() for t in grads)
        nbytes = sum(t.numel() * t.element_size() for t in grads)
        plan = Plan(lib, grads)
        ours = median_ms(lambda: plan.step(stream), args.steps)
        norm_ours, bad_ours = plan.step(stream)
        t_clip = median_ms(lambda: torch_clip_step(params, grads), args.steps)
        t_norm = median_ms(lambda: torch_norm_step(params, grads), args.steps)
        norm_torch, bad_torch = torch_norm_step(params, grads)
        agree = abs(norm_ours - norm_torch) <= 1e-2 * norm_torch and bad_ours == bad_torch == 0
        ok &= agree
        print(f"\n{name}: {len(grads)} tensors, {total / 1e6:.1f}M elements, {nbytes / 2**20:.0f} MiB")
        print(f"  trainwatch (2 kernels + read-back)      {ours:8.3f} ms")
        print(f"  torch clip_grad_norm_ + isfinite count  {t_clip:8.3f} ms  -> trainwatch"
              f" {t_clip / ours:5.1f}x faster (goal >= 2x: {'MET' if t_clip >= 2 * ours else 'MISSED'})")
        print(f"  torch norm only + isfinite count        {t_norm:8.3f} ms  -> trainwatch"
              f" {t_norm / ours:5.1f}x faster")
        print(f"  norm: trainwatch {norm_ours:.6g}, torch {norm_torch:.6g}"
              f" ({'agree' if agree else 'DISAGREE'})")
        del plan

    # Nonfinite counts against torch, on gradients with NaN / inf injected.
    _, params = make_case("specials", small, torch.bfloat16)
    grads = [p.grad for p in params]
    for i, t in enumerate(grads):
        if i % 7 == 0:
            t[i % t.numel()] = float("nan")
        if i % 11 == 0:
            t[(i * 3) % t.numel()] = float("inf")
        if i % 13 == 0:
            t[(i * 5) % t.numel()] = 1e30  # finite in bf16; its square overflows fp32
    plan = Plan(lib, grads)
    _, bad_ours = plan.step(stream)
    bad_torch = int(nonfinite_count(grads).item())
    finite_sq = sum(float(torch.nan_to_num(t.double(), nan=0.0, posinf=0.0, neginf=0.0)
                          .square().sum()) for t in grads)
    norm_ours = plan.out.sum_squares ** 0.5
    counts_ok = bad_ours == bad_torch and abs(norm_ours - finite_sq ** 0.5) <= 1e-5 * finite_sq ** 0.5
    ok &= counts_ok
    print(f"\nnonfinite count with injected NaN/inf: trainwatch {bad_ours}, torch {bad_torch};"
          f" finite norm {norm_ours:.6g} vs fp64 {finite_sq ** 0.5:.6g}"
          f" ({'agree' if counts_ok else 'DISAGREE'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
