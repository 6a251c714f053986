#!/usr/bin/env python3
"""The Python binding's CUDA path (DeviceStats) against torch, on a GPU.

DeviceStats is what trainwatch.torch's guard runs for CUDA tensors in a CUDA
build: add_logits() per micro-batch, finish() per optimizer step (grad stats,
log Z sums and the loss in one device-to-host copy). This script checks it
against float64 torch references, then times one optimizer step's
statistics side by side with the torch operations the guard falls back to
(trainwatch.torch.grad_stats and _device_log_z_sum: a fused norm, a
logsumexp, a sum, and their reads to the host).

Checks (exit 1 when any fails):
  - grad stats, fp32 / bf16 / fp16, healthy and with NaN, +inf, -inf and an
    fp32-overflowing square (1e30 in bf16), total and per tensor, and after
    the gradients moved (the plan's Rebind);
  - log Z over 3 micro-batches with ignore_index (-100 and -1), bf16 and
    fp32 logits, and a row holding a NaN;
  - the loss through the same copy;
  - one device-to-host copy per finish() (torch.profiler's CUDA activity,
    when CUPTI is there; otherwise reported as not measured);
  - bad input: host tensors, float64 gradients, mislabelled rows.

  python3 bench/kernels/device_stats_vs_torch.py [--module-dir DIR] [--steps 20]

--module-dir: the folder holding _trainwatch_device (bench/gpu_check.sh builds
it: kernels/ standalone with TRAINWATCH_KERNELS_BUILD_PYTHON_CHECK=ON);
without it, the product module trainwatch._trainwatch is used.
"""

import argparse
import math
import sys

import torch

from grad_stats_vs_torch import median_ms  # same folder

FAILURES = []


def check(ok, what):
    print(f"  {'ok  ' if ok else 'FAIL'} {what}")
    if not ok:
        FAILURES.append(what)


def load(module_dir):
    if module_dir:
        sys.path.insert(0, module_dir)
        import _trainwatch_device as m
    else:
        from trainwatch import _trainwatch as m
    if not m.has_cuda:
        sys.exit("the module was built without CUDA")
    return m


def stream():
    return torch.cuda.current_stream().cuda_stream


def ref_grads(grads):
    """(sum of squares over finite elements, nonfinite, max |x| finite) per
    tensor, in float64."""
    out = []
    for g in grads:
        x = g.double()
        finite = torch.isfinite(x)
        fx = torch.where(finite, x, torch.zeros((), dtype=x.dtype, device=x.device))
        out.append((float(fx.pow(2).sum()), int((~finite).sum()),
                    float(fx.abs().max()) if g.numel() else 0.0))
    return out


def close(a, b, rel):
    return a == b or abs(a - b) <= rel * max(abs(a), abs(b))


def make_grads(dtype, sizes, specials, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    grads = [(torch.randn(n, device="cuda", generator=g) * 1e-2).to(dtype) for n in sizes]
    if specials:
        grads[2][5] = math.nan
        grads[3][0] = math.inf
        grads[3][7] = -math.inf
        if dtype == torch.bfloat16:
            grads[4][2] = 1e30  # finite in bf16; its square overflows fp32
    return grads


def check_grad_stats(m):
    print("grad stats against float64 torch")
    sizes = [1, 3, 1000, 4097, 70001, 0, 131072 + 5, 2 ** 20 + 3, 17]
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for specials in (False, True):
            ds = m.DeviceStats()
            grads = make_grads(dtype, sizes, specials, seed=3)
            want = ref_grads(grads)
            for rebind in (False, True):
                if rebind:  # same shapes, new buffers: the plan's Rebind
                    grads = [t.clone() for t in grads]
                r = ds.finish(grads, stream(), True)
                ss = sum(w[0] for w in want)
                bad = sum(w[1] for w in want)
                name = f"{dtype}, {'with' if specials else 'no'} nonfinite" + \
                    (", rebound" if rebind else "")
                ok = (close(r["sum_squares"], ss, 1e-5) and r["nonfinite"] == bad
                      and r["elements"] == sum(sizes)
                      and close(r["max_abs"], max(w[2] for w in want), 0)
                      and r["tensor_elements"] == sizes
                      and all(close(a, w[0], 1e-5) and b == w[1] for a, b, w in
                              zip(r["tensor_sum_squares"], r["tensor_nonfinite"], want)))
                check(ok, f"{name}: norm {math.sqrt(r['sum_squares']):.6g} vs "
                          f"{math.sqrt(ss):.6g}, nonfinite {r['nonfinite']} vs {bad}")
            check(ds.host_copies == 2, f"{dtype}: one copy per finish ({ds.host_copies} for 2)")


def check_log_z(m):
    print("log Z against float64 torch logsumexp")
    for dtype in (torch.float32, torch.bfloat16):
        for ignore_index in (-100, -1):
            ds = m.DeviceStats()
            want_sum, want_rows = 0.0, 0
            g = torch.Generator(device="cuda").manual_seed(5)
            for rows, vocab in ((64, 32000), (3, 50257), (200, 1000)):
                logits = (torch.randn(rows, vocab, device="cuda", generator=g) * 3).to(dtype)
                labels = torch.randint(0, vocab, (rows,), device="cuda", generator=g)
                labels[::4] = ignore_index
                keep = labels != ignore_index
                want_sum += float(torch.logsumexp(logits.double()[keep], dim=-1).sum())
                want_rows += int(keep.sum())
                ds.add_logits(logits, labels.to(torch.int32), ignore_index, stream())
            check(ds.pending_logits == 3, "3 micro-batches pending")
            loss = torch.tensor([2.5], dtype=torch.float64, device="cuda")
            r = ds.finish([], stream(), False, loss)
            check(close(r["log_z_sum"], want_sum, 1e-5) and r["log_z_rows"] == want_rows and
                  r["log_z_nonfinite_rows"] == 0 and r["loss"] == 2.5,
                  f"{dtype}, ignore_index {ignore_index}: sum {r['log_z_sum']:.6f} vs "
                  f"{want_sum:.6f}, rows {r['log_z_rows']} vs {want_rows}, loss {r['loss']}")
            check(ds.host_copies == 1 and ds.pending_logits == 0,
                  "one copy for 3 micro-batches and the loss")
    ds = m.DeviceStats()
    logits = torch.randn(8, 100, device="cuda")
    logits[2, 7] = math.nan
    ds.add_logits(logits, None, -100, stream())
    r = ds.finish([], stream(), False)
    check(r["log_z_nonfinite_rows"] == 1 and r["log_z_rows"] == 8, "a NaN row is counted")


def check_one_copy_profiled(m):
    print("device-to-host copies in one step (torch.profiler)")
    from torch.profiler import ProfilerActivity, profile
    ds = m.DeviceStats()
    grads = make_grads(torch.bfloat16, [4096, 100000, 7], False, seed=9)
    logits = torch.randn(32, 5000, device="cuda", dtype=torch.bfloat16)
    labels = torch.zeros(32, dtype=torch.int32, device="cuda")
    loss = torch.zeros(1, dtype=torch.float64, device="cuda")
    for _ in range(2):  # allocations first
        ds.add_logits(logits, labels, -100, stream())
        ds.finish(grads, stream(), True, loss)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            ds.add_logits(logits, labels, -100, stream())
        ds.finish(grads, stream(), True, loss)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    if not any("emcpy" in n for n in names):
        print("  not measured: the profiler recorded no CUDA copies (no CUPTI)")
        return
    dtoh = [n for n in names if "DtoH" in n or "Device -> Host" in n]
    check(len(dtoh) == 1, f"{len(dtoh)} device-to-host copies for 2 micro-batches and a step")


def check_bad_input(m):
    print("bad input")
    ds = m.DeviceStats()
    for what, fn, pattern in (
            ("host gradient", lambda: ds.finish([torch.zeros(3)], stream()), "on the host"),
            ("float64 gradient",
             lambda: ds.finish([torch.zeros(3, dtype=torch.float64, device="cuda")], stream()),
             "dtype"),
            ("labels per row", lambda: ds.add_logits(
                torch.zeros(4, 10, device="cuda"),
                torch.zeros(3, dtype=torch.int32, device="cuda"), -100, stream()),
             "one entry per row"),
            ("int64 labels", lambda: ds.add_logits(
                torch.zeros(4, 10, device="cuda"), torch.zeros(4, dtype=torch.int64,
                                                                device="cuda"), -100, stream()),
             "int32")):
        try:
            fn()
            check(False, f"{what}: accepted")
        except ValueError as e:
            check(pattern in str(e), f"{what}: {e}")


def torch_step(grads, micro_batches):
    """What trainwatch.torch does for CUDA tensors without the kernels: the
    fused norm (bf16/fp16 norms in float32), a logsumexp per micro-batch,
    and their reads to the host."""
    low = (torch.bfloat16, torch.float16)
    rest = [g for g in grads if g.dtype not in low]
    norms = list(torch._foreach_norm(rest)) if rest else []
    norms += [torch.linalg.vector_norm(g, dtype=torch.float32) for g in grads if g.dtype in low]
    total = float(torch.stack([n.double() for n in norms]).pow(2).sum())
    lz, rows = 0.0, 0
    for logits, labels in micro_batches:
        z = torch.logsumexp(logits.float(), dim=-1)[labels != -100]
        lz = lz + z.double().sum()
        rows += z.numel()
    return total, float(lz), rows


def kernel_step(ds, grads, micro_batches):
    """What the guard does with the kernels (labels converted to int32 on the
    device, as Guard.accumulate does)."""
    for logits, labels in micro_batches:
        ds.add_logits(logits, labels.to(torch.int32), -100, stream())
    r = ds.finish(grads, stream(), False)
    return r["sum_squares"], r["log_z_sum"], r["log_z_rows"]


def timing(m, steps):
    print("\none optimizer step's statistics, median ms (each step ends with its numbers on "
          "the host)")
    print(f"  {'case':<46} {'torch ops':>10} {'kernels':>9} {'torch/kernels':>14}")
    d, ff, layers, vocab = 1024, 4096, 12, 32000
    sizes = [vocab * d]
    for _ in range(layers):
        sizes += [d, d, 3 * d * d, d * d, d, d * ff, ff, ff * d, d, d, d]
    for dtype in (torch.bfloat16, torch.float32):
        grads = [(torch.randn(n, device="cuda") * 1e-3).to(dtype) for n in sizes]
        micro = []
        for _ in range(4):
            logits = torch.randn(2048, vocab, device="cuda").to(dtype)
            labels = torch.randint(0, vocab, (2048,), device="cuda")
            labels[::10] = -100
            micro.append((logits, labels))
        ds = m.DeviceStats()
        t_torch = median_ms(lambda: torch_step(grads, micro), steps)
        t_ours = median_ms(lambda: kernel_step(ds, grads, micro), steps)
        a, b = torch_step(grads, micro), kernel_step(ds, grads, micro)
        check(close(a[0], b[0], 1e-3) and close(a[1], b[1], 1e-4) and a[2] == b[2],
              f"timed case agrees with torch ({dtype})")
        name = (f"{dtype}: {len(grads)} tensors, {sum(sizes) / 1e6:.0f}M, "
                f"4 x 2048 x {vocab} logits")
        print(f"  {name:<46} {t_torch:10.3f} {t_ours:9.3f} {t_torch / t_ours:13.2f}x")
        print(f"RATIO|{dtype}|{t_torch / t_ours:.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--module-dir", default="")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch has no CUDA device: nothing to check")
        return 3
    m = load(args.module_dir)
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    check_grad_stats(m)
    check_log_z(m)
    check_one_copy_profiled(m)
    check_bad_input(m)
    timing(m, args.steps)
    if FAILURES:
        print(f"\n{len(FAILURES)} check(s) FAILED:")
        for f in FAILURES:
            print(f"  {f}")
        return 1
    print("\nall DeviceStats checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
