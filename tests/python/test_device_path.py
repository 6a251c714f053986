"""Which statistics path trainwatch.torch takes, and that each gives the
numbers of a float64 torch reference.

Runs everywhere: the build reports whether it has the CUDA kernels
(_trainwatch.built_with_cuda, as CMake configured it; has_cuda, a device to run them), the choice of path, and the
torch-operations fallback (what CUDA tensors get without a CUDA build, or in
a dtype the kernels do not read) against the host kernels on the same
gradients and logits. [gpu] cases (skipped without CUDA): the fused kernels'
path through Guard against the reference, and one device-to-host copy per
step."""

import contextlib
import math
import os
import types
import unittest
from unittest import mock

import torch

import trainwatch
import trainwatch.torch as twt
import trainwatch._stats as tws  # which path reads a step's tensors
from trainwatch import _trainwatch

GPU = torch.cuda.is_available() and _trainwatch.built_with_cuda
GPU_REASON = "[gpu] needs a CUDA device and a CUDA build"


def reference(grads, logits_batches, ignore_index):
    """(norm over finite elements, nonfinite fraction, mean log Z over counted
    rows) in float64."""
    ss, bad, n = 0.0, 0, 0
    for g in grads:
        g = g.detach().double().cpu()
        finite = torch.isfinite(g)
        ss += float(torch.where(finite, g, torch.zeros(())).pow(2).sum())
        bad += int((~finite).sum())
        n += g.numel()
    lz, rows = 0.0, 0
    for logits, labels in logits_batches:
        x = logits.detach().double().cpu().reshape(-1, logits.shape[-1])
        keep = labels.reshape(-1).cpu() != ignore_index
        lz += float(torch.logsumexp(x[keep], dim=-1).sum())
        rows += int(keep.sum())
    return math.sqrt(ss), bad / n, lz / rows


class Tiny(torch.nn.Module):
    """Parameters in `dtype`, arithmetic in float32 (torch 1.13 has no fp16
    matmul on the CPU), logits back in `dtype`."""

    def __init__(self, dtype, device):
        super().__init__()
        g = torch.Generator().manual_seed(0)

        def param(*shape):
            return torch.nn.Parameter(
                (0.3 * torch.randn(*shape, generator=g)).to(device=device, dtype=dtype))
        self.w1 = param(64, 37)
        self.w2 = param(19, 64)
        self.b2 = param(19)

    def forward(self, x):
        h = torch.tanh(x.float() @ self.w1.float().t())
        return (h @ self.w2.float().t() + self.b2.float()).to(self.w1.dtype)


def make_model(dtype, device):
    return Tiny(dtype, device)


def run_step(model, dtype, device, bad_values, on_device, ignore_index=-1, guard=None,
             around=None):
    """One optimizer step of 2 micro-batches through a Guard (a new one
    unless given), `around` (a context manager) around the micro-batches and
    observe(); returns the verdict, the guard and the reference numbers."""
    if guard is None:
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        agent = trainwatch.Agent(run_id=f"path-{dtype}-{on_device}")
        guard = twt.watch(opt, agent, params=model.named_parameters(), on_device=on_device)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    batches = []
    with around or contextlib.nullcontext():
        for micro in range(2):
            x = torch.randn(8, 37, device=device, dtype=dtype)
            logits = model(x)
            labels = torch.randint(0, 19, (8,), device=device)
            labels[micro::3] = ignore_index
            loss = torch.nn.functional.cross_entropy(logits.float(), labels,
                                                     ignore_index=ignore_index)
            (loss / 2).backward()
            guard.accumulate(loss, logits=logits, labels=labels, ignore_index=ignore_index)
            batches.append((logits, labels))
        grads = [p.grad for p in model.parameters()]
        flat = grads[0].view(-1)
        for i, v in enumerate(bad_values):
            flat[3 + 5 * i] = v
        verdict = guard.observe(0)
    return verdict, guard, reference(grads, batches, ignore_index)


class HasCudaTest(unittest.TestCase):
    def test_built_with_cuda_is_what_the_build_configured(self):
        expected = os.environ.get("TRAINWATCH_EXPECT_BUILT_WITH_CUDA")
        if expected is None:
            self.skipTest("TRAINWATCH_EXPECT_BUILT_WITH_CUDA not set (run through CTest)")
        built = expected.upper() in ("1", "ON", "TRUE")
        self.assertIs(_trainwatch.built_with_cuda, built)
        self.assertEqual(hasattr(_trainwatch, "DeviceStats"), built)

    def test_has_cuda_says_whether_a_device_can_run_the_kernels(self):
        # A CUDA build on a machine without a GPU (this one) has none; with
        # one, the driver and the architectures decide, so only the build's
        # absence of kernels is certain.
        if not _trainwatch.built_with_cuda or not torch.cuda.is_available():
            self.assertIs(_trainwatch.has_cuda, False)
        self.assertIn("has_cuda", dir(_trainwatch))
        with self.assertRaises(AttributeError):
            _trainwatch.no_such_attribute  # noqa: B018

    @unittest.skipUnless(_trainwatch.built_with_cuda and not torch.cuda.is_available(),
                         "needs a CUDA build on a machine without a device")
    def test_device_stats_without_a_device_is_a_clear_error(self):
        with self.assertRaisesRegex(RuntimeError, "no usable CUDA device"):
            _trainwatch.DeviceStats()

    @unittest.skipUnless(_trainwatch.built_with_cuda and not torch.cuda.is_available(),
                         "needs a CUDA build on a machine without a device")
    def test_kernels_that_cannot_run_fall_back_to_torch_with_a_warning(self):
        fake = types.SimpleNamespace(is_cuda=True, dtype=torch.float32,
                                     device=types.SimpleNamespace(index=0))
        with mock.patch.object(torch.cuda, "current_device", return_value=0), \
                mock.patch.object(tws, "_CUDA_KERNELS", None):
            with self.assertWarnsRegex(UserWarning, "CUDA kernels cannot run here"):
                self.assertFalse(tws._fused_cuda([fake]))
            self.assertFalse(tws._fused_cuda([fake]))  # decided once

    def test_fused_kernels_only_for_a_cuda_build_and_their_dtypes(self):
        def fake(dtype, index=0):
            return types.SimpleNamespace(is_cuda=True, dtype=dtype,
                                         device=types.SimpleNamespace(index=index))
        with mock.patch.object(torch.cuda, "current_device", return_value=0), \
                mock.patch.object(tws, "_CUDA_KERNELS", True):
            with mock.patch.object(tws, "_BUILT_WITH_CUDA", True):
                for dtype in (torch.float32, torch.bfloat16, torch.float16):
                    self.assertTrue(tws._fused_cuda([fake(dtype)]), dtype)
                self.assertFalse(tws._fused_cuda([fake(torch.float32), fake(torch.float64)]))
                self.assertFalse(tws._fused_cuda([fake(torch.float32, index=1)]))
                self.assertFalse(tws._fused_cuda([torch.zeros(3)]))
                self.assertFalse(tws._fused_cuda([]))
            with mock.patch.object(tws, "_BUILT_WITH_CUDA", False):
                self.assertFalse(tws._fused_cuda([fake(torch.float32)]))


class FallbackTest(unittest.TestCase):
    """The torch-operations path, run on host tensors with on_device=True,
    against the host kernels and the float64 reference."""

    def check(self, dtype, bad_values):
        fallback, g1, ref = run_step(make_model(dtype, "cpu"), dtype, "cpu", bad_values, True)
        host, g2, _ = run_step(make_model(dtype, "cpu"), dtype, "cpu", bad_values, False)
        self.assertEqual(g1.stats_path, "torch")
        self.assertEqual(g2.stats_path, "host")
        norm, nan_frac, log_z = ref
        for v in (fallback, host):
            self.assertAlmostEqual(v.grad_norm, norm, delta=1e-6 * norm)
            self.assertAlmostEqual(v.nan_frac, nan_frac, delta=1e-15)
            self.assertAlmostEqual(v.log_z, log_z, delta=1e-6 * abs(log_z))
        self.assertAlmostEqual(fallback.loss, host.loss, delta=1e-12)

    def test_fp32_healthy_and_nonfinite(self):
        self.check(torch.float32, ())
        self.check(torch.float32, (math.nan, math.inf, -math.inf))

    def test_bf16_healthy_and_nonfinite(self):
        # torch's own bf16 norm keeps 3 digits; the fallback sums in float32.
        self.check(torch.bfloat16, ())
        self.check(torch.bfloat16, (math.nan, -math.inf))

    def test_fp16_healthy_and_nonfinite(self):
        self.check(torch.float16, ())
        self.check(torch.float16, (math.inf, math.nan))


@unittest.skipUnless(GPU, GPU_REASON)
class GpuPathTest(unittest.TestCase):
    """[gpu] Guard on CUDA tensors through DeviceStats."""

    def check(self, dtype, bad_values):
        v, guard, (norm, nan_frac, log_z) = run_step(make_model(dtype, "cuda"), dtype, "cuda",
                                                     bad_values, False)
        self.assertEqual(guard.stats_path, "cuda")
        self.assertAlmostEqual(v.grad_norm, norm, delta=1e-5 * norm)
        self.assertAlmostEqual(v.nan_frac, nan_frac, delta=1e-15)
        self.assertAlmostEqual(v.log_z, log_z, delta=1e-5 * abs(log_z))
        if bad_values:
            self.assertEqual(v.tensors[0][0], "w1")
            self.assertEqual(v.tensors[0][1], len(bad_values))

    def test_gpu_fp32(self):
        self.check(torch.float32, ())
        self.check(torch.float32, (math.nan, math.inf, -math.inf))

    def test_gpu_bf16(self):
        self.check(torch.bfloat16, ())
        self.check(torch.bfloat16, (math.nan, math.inf))

    def test_gpu_fp16(self):
        self.check(torch.float16, ())
        self.check(torch.float16, (-math.inf, math.nan))

    def test_gpu_float64_takes_torch(self):
        _, guard, _ = run_step(make_model(torch.float64, "cuda"), torch.float64, "cuda", (), False)
        self.assertEqual(guard.stats_path, "torch")

    def test_gpu_one_copy_to_the_host_per_step(self):
        from torch.profiler import ProfilerActivity, profile
        model = make_model(torch.float32, "cuda")
        _, guard, _ = run_step(model, torch.float32, "cuda", (), False)  # allocations
        prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        run_step(model, torch.float32, "cuda", (), False, guard=guard, around=prof)
        names = [e.name for e in prof.events()]
        if not any("emcpy" in n for n in names):
            self.skipTest("the profiler recorded no CUDA copies (no CUPTI)")
        dtoh = [n for n in names if "DtoH" in n or "Device -> Host" in n]
        # Two micro-batches (loss, logits, labels) and the step: one copy.
        self.assertEqual(guard._device_stats.host_copies, 2)
        self.assertEqual(len(dtoh), 1, dtoh)


if __name__ == "__main__":
    unittest.main()
