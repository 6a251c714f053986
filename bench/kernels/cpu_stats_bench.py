#!/usr/bin/python3
"""CPU grad and logit statistics against fair baselines, in one process.

On the same host tensors, for float32, bfloat16 and float16, side by side:

  trainwatch   tw_kernels_grad_stats_cpu / tw_kernels_logit_stats_cpu (the
               C ABI, libtrainwatch_kernels_c.so), one thread: what the agent
               runs in the training thread
  plain read   tw_kernels_plain_word_sum over the same bytes, one thread and
               all threads (the memory's read bandwidth: the ceiling)
  torch        grads: torch._foreach_norm + vector_norm of the norms, plus
               the nonfinite count (~isfinite(g)).sum() per tensor, read with
               .item(); logits: torch.logsumexp(x, -1) summed, plus the max
               logit, in the tensor's own dtype. torch runs with its own
               default thread count, printed.
  numpy        a curiosity only: norm + isfinite().sum() on fp32 (fp16 widened
               to fp32, bf16 via a uint32 shift); its BLAS is named, read from
               the libraries mapped into this process.

Methods are timed in alternation: each repetition runs every method once, in
an order rotated from one repetition to the next, so a load spike on this
shared machine hits all of them alike. There are two alternations per
tensor set: trainwatch against the plain reads, and trainwatch against the
libraries. torch and numpy allocate temporaries as large as the tensors,
which pass through the cache and the memory between the timed calls: with
all five in one alternation, bf16's per-repetition ratio to the plain read
spread over [0.10, 6.26] and [0.05, 0.97] in two runs on a virtual machine,
and over [0.80, 1.06] and [0.88, 1.07] with the reads alternated apart, in
runs alternated with those (64 MiB). A ratio is computed per repetition
(baseline time / trainwatch time: above 1 means trainwatch is faster) and
reported as median [min, max]. Results are checked against each other and
against an fp64 computation before anything is printed (exit 1 on a
mismatch).

Goals (issue 16): grad and logit stats >= 0.9x the one-thread plain read for
every dtype, and faster than torch (ratio > 1).

With --json PATH (or TW_BENCH_JSON in the environment) every figure is also
written as a JSON list of {"figure", "value", "baseline", "ratio", "unit",
"median", "min", "max"}: value and baseline are median bandwidths in GB/s,
ratio = median = the median per-repetition ratio, min / max its spread.

  /usr/bin/python3 bench/kernels/cpu_stats_bench.py [--lib PATH] [--mb 64]
      [--reps 7] [--json PATH] [--smoke]
"""

import argparse
import concurrent.futures
import ctypes
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

TW_DTYPE = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
TORCH_LSE_OK = {torch.float32, torch.bfloat16, torch.float16}
NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


class TwGradStats(ctypes.Structure):
    _fields_ = [("sum_squares", ctypes.c_double), ("nonfinite", ctypes.c_int64),
                ("numel", ctypes.c_int64), ("max_abs", ctypes.c_double)]


class TwLogitStats(ctypes.Structure):
    _fields_ = [("sum_log_z", ctypes.c_double), ("rows_counted", ctypes.c_int64),
                ("nonfinite_rows", ctypes.c_int64), ("max_logit", ctypes.c_double)]


def find_lib(explicit):
    if explicit:
        return explicit
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for c in (os.environ.get("TRAINWATCH_KERNELS_LIB", ""),
              os.path.join(root, "build", "lib", "libtrainwatch_kernels_c.so")):
        if c and os.path.exists(c):
            return c
    sys.exit("libtrainwatch_kernels_c.so not found; pass --lib PATH")


def load(path):
    lib = ctypes.CDLL(path)  # ctypes releases the GIL during each call
    vp, i32, i64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
    lib.tw_kernels_grad_stats_cpu.argtypes = [
        ctypes.POINTER(vp), ctypes.POINTER(i32), ctypes.POINTER(i64), i64, i32,
        ctypes.POINTER(TwGradStats), vp, vp, vp]
    lib.tw_kernels_logit_stats_cpu.argtypes = [vp, i32, i64, i64, vp, i32, i32,
                                               ctypes.POINTER(TwLogitStats)]
    lib.tw_kernels_plain_word_sum.argtypes = [vp, i64]
    lib.tw_kernels_plain_word_sum.restype = ctypes.c_uint64
    lib.tw_kernels_last_error.restype = ctypes.c_char_p
    return lib


def blas_name():
    """The BLAS libraries numpy loaded, resolved through their symlinks."""
    found = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if "blas" in os.path.basename(path).lower() or "mkl" in path.lower():
                found.add(os.path.realpath(path))
    if not found:
        return "unknown (no BLAS library mapped)"
    kinds = []
    for p in sorted(found):
        kind = ("OpenBLAS" if "openblas" in p.lower() else "MKL" if "mkl" in p.lower()
                else "BLIS" if "blis" in p.lower() else "ATLAS" if "atlas" in p.lower()
                else "netlib reference BLAS" if "/blas/" in p else "BLAS")
        kinds.append(f"{kind} ({p})")
    return ", ".join(kinds)


class Plain:
    """The plain read of the same bytes, on one thread or on `threads`."""

    def __init__(self, lib, tensors, threads):
        self.lib = lib
        self.threads = threads
        self.spans = [(t.data_ptr(), t.numel() * t.element_size()) for t in tensors]
        # All threads: every span cut into `threads` word-aligned slices, so
        # each thread reads about the same number of bytes.
        self.slices = [[] for _ in range(threads)]
        for ptr, n in self.spans:
            step = (n // threads) & ~63
            for k in range(threads):
                lo = k * step
                hi = n if k == threads - 1 else lo + step
                self.slices[k].append((ptr + lo, hi - lo))
        self.pool = concurrent.futures.ThreadPoolExecutor(threads) if threads > 1 else None

    def _sum(self, spans):
        s = 0
        for ptr, n in spans:
            s += self.lib.tw_kernels_plain_word_sum(ptr, n)
        return s

    def one(self):
        return self._sum(self.spans)

    def all(self):
        return sum(self.pool.map(self._sum, self.slices))


def grad_stats(lib, tensors):
    n = len(tensors)
    data = (ctypes.c_void_p * n)(*[t.data_ptr() for t in tensors])
    dtypes = (ctypes.c_int32 * n)(*[TW_DTYPE[t.dtype] for t in tensors])
    numels = (ctypes.c_int64 * n)(*[t.numel() for t in tensors])
    out = TwGradStats()

    def run():
        if lib.tw_kernels_grad_stats_cpu(data, dtypes, numels, n, 0, ctypes.byref(out),
                                         None, None, None):
            raise RuntimeError(lib.tw_kernels_last_error().decode())
        return out.sum_squares, out.nonfinite
    return run


def logit_stats(lib, logits):
    out = TwLogitStats()
    rows, vocab = logits.shape

    def run():
        if lib.tw_kernels_logit_stats_cpu(logits.data_ptr(), TW_DTYPE[logits.dtype], rows,
                                          vocab, None, -100, 0, ctypes.byref(out)):
            raise RuntimeError(lib.tw_kernels_last_error().decode())
        return out.sum_log_z, out.max_logit
    return run


def torch_grad(grads):
    norms = torch._foreach_norm(grads, 2)
    norm = torch.linalg.vector_norm(torch.stack([x.float() for x in norms]), 2)
    bad = torch.stack([(~torch.isfinite(g)).sum() for g in grads]).sum()
    return float(norm.item()), int(bad.item())


def torch_logits(logits):
    # torch 1.13 has no CPU exp for float16: it gets the widening a user
    # would need (the first call fails, and the wide path is used from then).
    x = logits if logits.dtype in TORCH_LSE_OK else logits.float()
    try:
        lse = torch.logsumexp(x, -1)
    except RuntimeError:
        TORCH_LSE_OK.discard(logits.dtype)
        return torch_logits(logits)
    return float(lse.sum().item()), float(logits.max().item())


def numpy_grad(arrays, dtype):
    """numpy's nearest equivalent; bf16 has no numpy type: a uint32 shift."""
    sq, finite = 0.0, 0
    for a in arrays:
        if dtype == torch.bfloat16:
            w = (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            w = a.astype(np.float32, copy=False)
        sq += float(np.linalg.norm(w)) ** 2
        finite += int(np.isfinite(w).sum())
    return sq, finite


def alternate(methods, reps):
    """Times every method once per repetition, in a rotated order."""
    names = list(methods)
    for fn in methods.values():
        fn()  # warm-up: page faults, thread pools, caches of the library
    times = {k: [] for k in names}
    for r in range(reps):
        order = names[r % len(names):] + names[:r % len(names)]
        for k in order:
            t0 = time.perf_counter()
            methods[k]()
            times[k].append(time.perf_counter() - t0)
    return times


def print_times(reads, libs, nbytes):
    """Each method's median time and bandwidth, trainwatch once per alternation."""
    for label, times in (("with the reads", reads), ("with the libraries", libs)):
        for k, v in times.items():
            name = f"{k} ({label})" if k == "trainwatch" else k
            print(f"  {name:<32} {statistics.median(v) * 1e3:8.2f} ms "
                  f"{nbytes / statistics.median(v) / 1e9:7.2f} GB/s")


def figure(name, times, ours, base, nbytes):
    ratios = [b / o for o, b in zip(times[ours], times[base])]
    med = statistics.median(ratios)
    return {"figure": name, "unit": "GB/s",
            "value": nbytes / statistics.median(times[ours]) / 1e9,
            "baseline": nbytes / statistics.median(times[base]) / 1e9,
            "ratio": med, "median": med, "min": min(ratios), "max": max(ratios)}


def make_grads(dtype, nbytes, pieces, gen):
    """`pieces` tensors of about nbytes in all, ~1e-3, a few NaN and inf."""
    per = max(64, nbytes // pieces // torch.tensor([], dtype=dtype).element_size())
    grads = []
    for i in range(pieces):
        t = (torch.randn(per, generator=gen) * 1e-3).to(dtype)
        t[i % per] = float("nan")
        t[(7 * i + 3) % per] = float("inf")
        grads.append(t)
    return grads


def fp64_grad_truth(grads):
    sq, bad = 0.0, 0
    for g in grads:
        d = g.double()
        ok = torch.isfinite(d)
        bad += int((~ok).sum())
        sq += float(d[ok].square().sum())
    return sq, bad


def close(a, b, rel):
    return abs(a - b) <= rel * max(abs(b), 1e-300)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default="")
    ap.add_argument("--mb", type=int, default=64, help="MiB of gradients / logits per dtype")
    ap.add_argument("--reps", type=int, default=7, help="alternating repetitions")
    ap.add_argument("--pieces", type=int, default=16, help="gradient tensors per dtype")
    ap.add_argument("--json", default=os.environ.get("TW_BENCH_JSON", ""),
                    help="write the figures to this file as a JSON list")
    ap.add_argument("--smoke", action="store_true", help="4 MiB, 3 reps: seconds, for tests")
    args = ap.parse_args()
    if args.smoke:
        args.mb, args.reps = 4, 3
    if args.mb < 1 or args.reps < 1 or args.pieces < 1:
        sys.exit("--mb, --reps and --pieces must be >= 1")
    lib = load(find_lib(args.lib))
    threads = os.cpu_count() or 1
    nbytes = args.mb << 20
    gen = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__} with {torch.get_num_threads()} thread(s); "
          f"numpy {np.__version__} on {blas_name()}; {threads} cores; "
          f"{args.mb} MiB per dtype, {args.reps} alternating repetitions")
    figures, ok = [], True
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        dn = NAMES[dtype]
        # ---- gradients
        grads = make_grads(dtype, nbytes, args.pieces, gen)
        gbytes = sum(g.numel() * g.element_size() for g in grads)
        arrays = [g.view(torch.int16).numpy() if dtype == torch.bfloat16 else g.numpy()
                  for g in grads]
        plain = Plain(lib, grads, threads)
        ours = grad_stats(lib, grads)
        reads = alternate({"trainwatch": ours, "plain 1 thread": plain.one,
                           "plain all threads": plain.all if plain.pool else plain.one},
                          args.reps)
        libs = alternate({"trainwatch": ours, "torch": lambda: torch_grad(grads),
                          "numpy": lambda: numpy_grad(arrays, dtype)}, args.reps)
        sq, bad = ours()
        truth_sq, truth_bad = fp64_grad_truth(grads)
        _, torch_bad = torch_grad(grads)
        _, np_finite = numpy_grad(arrays, dtype)
        agree = (close(sq, truth_sq, 1e-5) and bad == truth_bad == torch_bad
                 and np_finite == sum(g.numel() for g in grads) - truth_bad)
        ok &= agree
        print(f"\n{dn} grads: {len(grads)} tensors, {gbytes / 2**20:.0f} MiB; norm "
              f"{sq ** 0.5:.7g} (fp64 {truth_sq ** 0.5:.7g}), nonfinite {bad} (torch {torch_bad})"
              f" {'agree' if agree else 'MISMATCH'}")
        print_times(reads, libs, gbytes)
        for times, base, label in ((reads, "plain 1 thread", "vs plain 1-thread read"),
                                   (reads, "plain all threads", f"vs plain {threads}-thread read"),
                                   (libs, "torch", "vs torch _foreach_norm + isfinite"),
                                   (libs, "numpy", "vs numpy (curiosity)")):
            figures.append(figure(f"grad stats {dn} {label}", times, "trainwatch", base, gbytes))
        del grads, arrays, plain
        # ---- logits: rows x 32k vocabulary, one NaN row
        vocab = 32000
        rows = max(1, nbytes // (vocab * torch.tensor([], dtype=dtype).element_size()))
        logits = (torch.randn(rows, vocab, generator=gen) * 2.0).to(dtype)
        lbytes = logits.numel() * logits.element_size()
        plain = Plain(lib, [logits], threads)
        ours = logit_stats(lib, logits)
        reads = alternate({"trainwatch": ours, "plain 1 thread": plain.one,
                           "plain all threads": plain.all if plain.pool else plain.one},
                          args.reps)
        libs = alternate({"trainwatch": ours, "torch": lambda: torch_logits(logits)}, args.reps)
        sum_lz, max_logit = ours()
        truth_lz = float(torch.logsumexp(logits.double(), -1).sum())
        torch_lz, torch_max = torch_logits(logits)
        agree = close(sum_lz, truth_lz, 1e-5) and max_logit == torch_max
        ok &= agree
        print(f"{dn} logits: {rows} x {vocab}, {lbytes / 2**20:.0f} MiB; sum log Z {sum_lz:.9g} "
              f"(fp64 {truth_lz:.9g}, torch in {dn} {torch_lz:.9g}) {'agree' if agree else 'MISMATCH'}")
        print_times(reads, libs, lbytes)
        torch_label = ("vs torch logsumexp + max" if dtype in TORCH_LSE_OK
                       else "vs torch logsumexp(float()) + max")
        for times, base, label in ((reads, "plain 1 thread", "vs plain 1-thread read"),
                                   (reads, "plain all threads", f"vs plain {threads}-thread read"),
                                   (libs, "torch", torch_label)):
            figures.append(figure(f"logit stats {dn} {label}", times, "trainwatch", base, lbytes))
        del logits, plain
    print("\nratio = baseline time / trainwatch time per repetition: median [min, max]")
    for f in figures:
        print(f"  {f['figure']:<52} {f['median']:6.2f} [{f['min']:.2f}, {f['max']:.2f}]"
              f"  ({f['value']:.1f} vs {f['baseline']:.1f} GB/s)")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(figures, out, indent=1)
    if not ok:
        print("MISMATCH: see the values above", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
