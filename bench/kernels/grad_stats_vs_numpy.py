#!/usr/bin/python3
"""CPU grad stats next to numpy, on the same 256 MB array, in one process.

Loads the C ABI library (libtrainwatch_kernels_c.so) through ctypes and
times, best of --reps runs each:

  numpy:      np.linalg.norm(x) and np.isfinite(x).sum()   (fp32)
  trainwatch: tw_kernels_grad_stats_cpu on the same buffer  (one thread)
  plain sum:  tw_kernels_plain_word_sum over the same bytes (one thread)

For 2-byte gradients numpy has no bfloat16; it gets float16 of the same
size, and the widening a numpy user would need for bf16 (shift to float32
bits) is timed too. Results are checked against each other before the
timings are printed, against a float64 computation over the finite elements
(the arrays hold a few NaNs and infs, which make numpy's norm NaN; on clean
fp32 data numpy's norm also drifts, as it accumulates in fp32). Usage:

  /usr/bin/python3 bench/kernels/grad_stats_vs_numpy.py [--lib PATH] [--mb 256]
"""

import argparse
import ctypes
import os
import sys
import time

import numpy as np

DTYPE_F32, DTYPE_BF16, DTYPE_F16 = 0, 1, 2


class TwGradStats(ctypes.Structure):
    _fields_ = [("sum_squares", ctypes.c_double), ("nonfinite", ctypes.c_int64),
                ("numel", ctypes.c_int64), ("max_abs", ctypes.c_double)]


def find_lib(explicit):
    if explicit:
        return explicit
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    candidates = [os.environ.get("TRAINWATCH_KERNELS_LIB", "")]
    for build in ("build", "build-gpu-check", "build-kernels"):
        candidates.append(os.path.join(root, build, "lib", "libtrainwatch_kernels_c.so"))
    for c in candidates:
        if c and os.path.exists(c):
            return c
    sys.exit("libtrainwatch_kernels_c.so not found; pass --lib PATH")


def load(path):
    lib = ctypes.CDLL(path)
    lib.tw_kernels_grad_stats_cpu.argtypes = [
        ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int32),
        ctypes.POINTER(ctypes.c_int64), ctypes.c_int64, ctypes.c_int32,
        ctypes.POINTER(TwGradStats), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.tw_kernels_grad_stats_cpu.restype = ctypes.c_int
    lib.tw_kernels_plain_word_sum.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.tw_kernels_plain_word_sum.restype = ctypes.c_uint64
    lib.tw_kernels_last_error.restype = ctypes.c_char_p
    return lib


def grad_stats(lib, arr, dtype):
    data = (ctypes.c_void_p * 1)(arr.ctypes.data)
    dtypes = (ctypes.c_int32 * 1)(dtype)
    numels = (ctypes.c_int64 * 1)(arr.size)
    out = TwGradStats()
    rc = lib.tw_kernels_grad_stats_cpu(data, dtypes, numels, 1, 0, ctypes.byref(out),
                                       None, None, None)
    if rc != 0:
        sys.exit("grad stats failed: " + lib.tw_kernels_last_error().decode())
    return out


def fp64_truth(wide):
    """Sum of squares in float64 and the finite count, in chunks (untimed)."""
    total, finite = 0.0, 0
    for i in range(0, wide.size, 1 << 23):
        c = wide[i:i + (1 << 23)].astype(np.float64)
        ok = np.isfinite(c)
        finite += int(ok.sum())
        c = c[ok]
        total += float(np.dot(c, c))
    return total, finite


def close(a, b, rel=1e-5):
    return abs(a - b) <= rel * abs(b)


def best_of(fn, reps):
    best, result = float("inf"), None
    for _ in range(reps):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default="")
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    lib = load(find_lib(args.lib))
    nbytes = args.mb << 20
    rng = np.random.default_rng(0)
    print(f"numpy {np.__version__}, {nbytes / 2**20:.0f} MiB per array, best of {args.reps}")

    def report(name, seconds):
        print(f"  {name:<44} {seconds * 1e3:8.1f} ms {nbytes / seconds / 1e9:7.1f} GB/s")

    ok = True
    # ---- fp32
    x = (rng.standard_normal(nbytes // 4, dtype=np.float32) * 1e-3).astype(np.float32)
    x[::1000003] = np.nan  # a few nonfinite gradients, as the product must count
    x[5::999983] = np.inf
    t_plain, _ = best_of(lambda: lib.tw_kernels_plain_word_sum(x.ctypes.data, x.nbytes), args.reps)
    t_ours, st = best_of(lambda: grad_stats(lib, x, DTYPE_F32), args.reps)
    t_np, (norm, finite) = best_of(
        lambda: (np.linalg.norm(x), int(np.isfinite(x).sum())), args.reps)
    truth, truth_finite = fp64_truth(x)
    ok &= close(st.sum_squares, truth) and st.numel - st.nonfinite == truth_finite
    ok &= finite == truth_finite
    print(f"float32: norm fp64 truth {truth ** 0.5:.7g}, trainwatch {st.sum_squares ** 0.5:.7g},"
          f" numpy {float(norm):.7g} (NaN: the array holds NaNs)")
    report("plain sum over the bytes (1 thread)", t_plain)
    report("trainwatch grad stats (1 thread)", t_ours)
    report("numpy norm + isfinite().sum()", t_np)
    print(f"  grad stats vs plain sum: {t_plain / t_ours:.2f}x of its bandwidth;"
          f" vs numpy: {t_np / t_ours:.2f}x faster")

    # ---- 2-byte gradients: bf16 (ours) next to fp16 (numpy's nearest type)
    bits32 = (rng.standard_normal(nbytes // 2, dtype=np.float32) * 1e-3).view(np.uint32)
    bf16 = (bits32 >> 16).astype(np.uint16)
    bf16[::1000003] = 0x7fc0  # a few NaNs
    bf16[7::999983] = 0xff80  # and -inf
    del bits32
    f16 = bf16.view(np.float16).copy()
    f16[:] = rng.standard_normal(f16.size, dtype=np.float32).astype(np.float16)
    t_plain2, _ = best_of(lambda: lib.tw_kernels_plain_word_sum(bf16.ctypes.data, bf16.nbytes),
                          args.reps)
    t_bf16, st_bf16 = best_of(lambda: grad_stats(lib, bf16, DTYPE_BF16), args.reps)
    t_f16, st_f16 = best_of(lambda: grad_stats(lib, f16, DTYPE_F16), args.reps)
    t_np16, (norm16, finite16) = best_of(
        lambda: (np.linalg.norm(f16.astype(np.float32)), int(np.isfinite(f16).sum())),
        max(1, args.reps // 2))

    def np_bf16():
        wide = (bf16.astype(np.uint32) << 16).view(np.float32)
        return np.linalg.norm(wide), int(np.isfinite(wide).sum())

    t_npbf, (normbf, finitebf) = best_of(np_bf16, max(1, args.reps // 2))
    t16, f16_finite = fp64_truth(f16)
    tbf, bf_finite = fp64_truth((bf16.astype(np.uint32) << 16).view(np.float32))
    ok &= close(st_f16.sum_squares, t16) and st_f16.numel - st_f16.nonfinite == f16_finite
    ok &= close(st_bf16.sum_squares, tbf) and st_bf16.numel - st_bf16.nonfinite == bf_finite
    ok &= finite16 == f16_finite and finitebf == bf_finite
    print(f"bfloat16 / float16 (same byte count): bf16 norm fp64 truth {tbf ** 0.5:.7g},"
          f" trainwatch {st_bf16.sum_squares ** 0.5:.7g}, numpy {float(normbf):.7g}")
    report("plain sum over the bytes (1 thread)", t_plain2)
    report("trainwatch grad stats, bf16 (1 thread)", t_bf16)
    report("trainwatch grad stats, fp16 (1 thread)", t_f16)
    report("numpy fp16: norm(astype f32) + isfinite", t_np16)
    report("numpy bf16 via uint32 shift: norm + isfinite", t_npbf)
    print(f"  bf16 grad stats vs plain sum: {t_plain2 / t_bf16:.2f}x of its bandwidth;"
          f" vs numpy bf16: {t_npbf / t_bf16:.2f}x faster; fp16 vs numpy fp16:"
          f" {t_np16 / t_f16:.2f}x faster")
    print("trainwatch matches the fp64 truth; finite counts agree with numpy" if ok
          else "MISMATCH (see the values above)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
