// GPU benchmark of the statistics kernels, a plain program on the CUDA
// runtime (no benchmark library: it must build on a bare GPU box). Every
// figure is set against a device-to-device copy of the same bytes measured in
// the same run:
//
//   1. grad stats on 1 GiB of bf16 gradients (one tensor, and the same bytes
//      as 300 tensors): % of copy bandwidth, goal >= 85%;
//   2. kernels per step for 1,000 small tensors, counted by capturing a step
//      into a CUDA graph, goal <= 2, and the time of such a step;
//   3. logit stats on [rows x 32768] and [rows x 131072] bf16 / fp32 logits:
//      % of copy bandwidth, goal >= 80%;
//      and on short batches (256 and 64 rows: rows split across blocks);
//   4. the fused cross entropy + z-loss forward/backward, out of place and
//      in place, for information.
//
// Each goal is also printed as GOAL|name|measured|goal|MET or MISSED for
// bench/gpu_check.sh's summary table.
//
// Bandwidth conventions, printed with the numbers: a copy of N bytes moves 2N
// (read + write), so copy bandwidth = 2N / t_copy, the usual device-to-device
// figure; a statistics kernel reads N, so its bandwidth = N / t. The ratio
// compares the two. Times are medians over repetitions, after warm-up.
//
// Exit status: 0 when everything ran (goals missed are reported, not
// fatal), 1 on a CUDA error, 0 with a message when built without CUDA or no
// device is present.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "trainwatch/kernels/grad_stats.h"
#include "trainwatch/kernels/half.h"
#include "trainwatch/kernels/tensor_view.h"

#if defined(TRAINWATCH_KERNELS_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "trainwatch/kernels/cuda.h"
#endif

#if !defined(TRAINWATCH_KERNELS_HAVE_CUDA)

int main() {
  std::printf("kernels_gpu_bench: built without CUDA; nothing to measure\n");
  return 0;
}

#else

namespace {

using namespace trainwatch::kernels;  // a benchmark program, not a library

#define CHECK_CUDA(call)                                                 \
  do {                                                                   \
    cudaError_t e_ = (call);                                             \
    if (e_ != cudaSuccess) {                                             \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, \
                   cudaGetErrorString(e_));                              \
      std::exit(1);                                                      \
    }                                                                    \
  } while (0)

#define CHECK_OK(expr)                                        \
  do {                                                        \
    Status s_ = (expr);                                       \
    if (!s_.ok()) {                                           \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, \
                   s_.ToString().c_str());                    \
      std::exit(1);                                           \
    }                                                         \
  } while (0)

constexpr int kWarmup = 3;
constexpr int kReps = 15;

int failures_of_goals = 0;

// Prints a goal for people and, as GOAL|name|measured|goal|MET or MISSED,
// for bench/gpu_check.sh's summary table (the names it expects are listed
// there).
void Goal(const char* name, double measured, double goal, bool at_most,
          const char* unit) {
  const bool met = at_most ? measured <= goal : measured >= goal;
  std::printf("    goal %-52s %s\n", name, met ? "MET" : "MISSED");
  std::printf("GOAL|%s|%.1f%s|%s %.0f%s|%s\n", name, measured, unit,
              at_most ? "<=" : ">=", goal, unit, met ? "MET" : "MISSED");
  if (!met) ++failures_of_goals;
}

// Median time in ms of `fn` enqueued on `stream`, each rep timed by events.
template <typename Fn>
double MedianMs(cudaStream_t stream, Fn fn) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < kWarmup; ++i) fn();
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<float> ms;
  for (int i = 0; i < kReps; ++i) {
    CHECK_CUDA(cudaEventRecord(a, stream));
    fn();
    CHECK_CUDA(cudaEventRecord(b, stream));
    CHECK_CUDA(cudaEventSynchronize(b));
    float t;
    CHECK_CUDA(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Fills `bytes` of device memory with pseudo-random values of `dtype`
// around `scale` (a host pattern of 64 MiB, copied repeatedly).
void FillDevice(void* dst, size_t bytes, DType dtype, float scale) {
  const size_t chunk = std::min(bytes, size_t{64} << 20);
  std::vector<char> host(chunk);
  uint64_t s = 0x9e3779b97f4a7c15ull ^ bytes;
  const size_t esize = DTypeSize(dtype);
  for (size_t i = 0; i + esize <= chunk; i += esize) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const float f = static_cast<float>(static_cast<int32_t>(s >> 32)) /
                    2147483648.0f * scale;
    if (dtype == DType::kFloat32) {
      std::memcpy(&host[i], &f, 4);
    } else {
      const uint16_t h = dtype == DType::kBFloat16 ? FloatToBFloat16Bits(f)
                                                   : FloatToHalfBits(f);
      std::memcpy(&host[i], &h, 2);
    }
  }
  for (size_t off = 0; off < bytes; off += chunk) {
    CHECK_CUDA(cudaMemcpy(static_cast<char*>(dst) + off, host.data(),
                          std::min(chunk, bytes - off),
                          cudaMemcpyHostToDevice));
  }
}

double CopyMs(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  return MedianMs(stream, [&] {
    CHECK_CUDA(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
  });
}

void GradStatsVsCopy(cudaStream_t stream) {
  const size_t bytes = size_t{1} << 30;
  void* src;
  void* dst;
  CHECK_CUDA(cudaMalloc(&src, bytes));
  CHECK_CUDA(cudaMalloc(&dst, bytes));
  FillDevice(src, bytes, DType::kBFloat16, 1e-2f);
  const double copy_ms = CopyMs(dst, src, bytes, stream);
  const double copy_gbs = 2.0 * bytes / (copy_ms * 1e-3) / 1e9;
  std::printf("\n[1] grad stats, 1 GiB of bf16 gradients\n");
  std::printf("    device-to-device copy: %.3f ms, %.0f GB/s (read + write)\n",
              copy_ms, copy_gbs);

  // One tensor, then the same bytes cut into 300 tensors of uneven sizes.
  std::vector<std::vector<TensorView> > layouts(2);
  const int64_t numel = static_cast<int64_t>(bytes / 2);
  layouts[0].push_back(TensorView{src, DType::kBFloat16, numel});
  {
    uint64_t s = 7;
    int64_t off = 0;
    for (int i = 0; i < 300 && off < numel; ++i) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      int64_t n = i == 299
                      ? numel - off
                      : std::min<int64_t>(numel - off,
                                          1 + (s >> 40) % (2 * numel / 300));
      n = std::max<int64_t>(1, n);
      layouts[1].push_back(
          TensorView{static_cast<char*>(src) + off * 2, DType::kBFloat16, n});
      off += n;
    }
  }
  const char* names[] = {"1 tensor", "300 tensors"};
  for (int l = 0; l < 2; ++l) {
    std::unique_ptr<GradStatsGpuPlan> plan;
    GradStatsOptions options;
    options.per_tensor = l == 1;
    CHECK_OK(GradStatsGpuPlan::Create(layouts[l].data(), layouts[l].size(),
                                      options, &plan));
    const double ms = MedianMs(stream, [&] { CHECK_OK(plan->Launch(stream)); });
    CHECK_OK(plan->ReadbackAsync(stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    GradStats st;
    CHECK_OK(plan->Result(&st));
    const double gbs = bytes / (ms * 1e-3) / 1e9;
    std::printf(
        "    grad stats (%s, %lld blocks): %.3f ms, %.0f GB/s read = %.1f%% of "
        "copy"
        " [norm %.6g, nonfinite %lld]\n",
        names[l], static_cast<long long>(plan->block_count()), ms, gbs,
        100.0 * gbs / copy_gbs, st.norm(),
        static_cast<long long>(st.nonfinite));
    Goal(l == 0 ? "grad stats, 1 tensor (% of copy bandwidth)"
                : "grad stats, 300 tensors (% of copy bandwidth)",
         100.0 * gbs / copy_gbs, 85.0, false, "%");
  }
  CHECK_CUDA(cudaFree(src));
  CHECK_CUDA(cudaFree(dst));
}

void SmallTensorLaunches(cudaStream_t stream) {
  std::printf("\n[2] 1,000 small tensors (bf16, 1..8191 elements)\n");
  std::vector<void*> bufs;
  std::vector<TensorView> views;
  uint64_t s = 11;
  int64_t total = 0;
  for (int i = 0; i < 1000; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const int64_t n = 1 + static_cast<int64_t>((s >> 33) % 8191);
    void* p;
    CHECK_CUDA(cudaMalloc(&p, n * 2));
    FillDevice(p, n * 2, DType::kBFloat16, 1.0f);
    bufs.push_back(p);
    views.push_back(TensorView{p, DType::kBFloat16, n});
    total += n;
  }
  GradStatsOptions options;
  options.per_tensor = true;
  std::unique_ptr<GradStatsGpuPlan> plan;
  CHECK_OK(
      GradStatsGpuPlan::Create(views.data(), views.size(), options, &plan));

  cudaGraph_t graph;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  CHECK_OK(plan->Launch(stream));
  CHECK_OK(plan->ReadbackAsync(stream));
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  size_t n = 0;
  CHECK_CUDA(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  CHECK_CUDA(cudaGraphGetNodes(graph, nodes.data(), &n));
  int kernels = 0, copies = 0;
  for (auto node : nodes) {
    cudaGraphNodeType type;
    CHECK_CUDA(cudaGraphNodeGetType(node, &type));
    kernels += type == cudaGraphNodeTypeKernel;
    copies += type == cudaGraphNodeTypeMemcpy;
  }
  CHECK_CUDA(cudaGraphDestroy(graph));
  std::printf(
      "    one step, captured as a graph: %d kernels, %d copy (%lld elements, "
      "%lld blocks)\n",
      kernels, copies, static_cast<long long>(total),
      static_cast<long long>(plan->block_count()));
  Goal("kernels per step, 1000 tensors", kernels, 2.0, true, "");

  // Wall time of a whole step as a trainer sees it: launch, read back, sync.
  const double ms = MedianMs(stream, [&] {
    CHECK_OK(plan->Launch(stream));
    CHECK_OK(plan->ReadbackAsync(stream));
  });
  std::printf("    GPU time of one step (kernels + read-back): %.1f us\n",
              ms * 1e3);
  for (void* p : bufs) CHECK_CUDA(cudaFree(p));
}

void LogitStatsVsCopy(cudaStream_t stream) {
  std::printf("\n[3] logit stats (online softmax, one read)\n");
  struct Case {
    DType dtype;
    int64_t rows, vocab;
  };
  const Case cases[] = {{DType::kBFloat16, 16384, 32768},
                        {DType::kFloat32, 8192, 32768},
                        {DType::kBFloat16, 4096, 131072},
                        {DType::kBFloat16, 4096, 50257},
                        // A short batch: rows split across blocks.
                        {DType::kBFloat16, 256, 131072},
                        {DType::kBFloat16, 64, 50257}};
  for (const Case& c : cases) {
    const size_t bytes =
        static_cast<size_t>(c.rows * c.vocab) * DTypeSize(c.dtype);
    void* src;
    void* dst;
    CHECK_CUDA(cudaMalloc(&src, bytes));
    CHECK_CUDA(cudaMalloc(&dst, bytes));
    FillDevice(src, bytes, c.dtype, 8.0f);
    const double copy_ms = CopyMs(dst, src, bytes, stream);
    const double copy_gbs = 2.0 * bytes / (copy_ms * 1e-3) / 1e9;
    std::unique_ptr<LogitStatsGpu> ws;
    CHECK_OK(LogitStatsGpu::Create(c.rows, &ws));
    const LogitsView view{src, c.dtype, c.rows, c.vocab, 0};
    const double ms = MedianMs(stream, [&] {
      CHECK_OK(ws->Launch(view, LogitStatsOptions(), stream));
    });
    CHECK_OK(ws->ReadbackAsync(stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    LogitStats st;
    CHECK_OK(ws->Result(&st));
    const double gbs = bytes / (ms * 1e-3) / 1e9;
    std::printf(
        "    %s [%lld x %lld] %.0f MiB: copy %.0f GB/s; logit stats %.3f ms, "
        "%.0f GB/s"
        " = %.1f%% of copy [mean log Z %.4f]\n",
        DTypeName(c.dtype), static_cast<long long>(c.rows),
        static_cast<long long>(c.vocab), bytes / 1048576.0, copy_gbs, ms, gbs,
        100.0 * gbs / copy_gbs, st.mean_log_z());
    if (c.vocab == 32768) {
      Goal(c.dtype == DType::kBFloat16
               ? "logit stats bf16 32k (% of copy bandwidth)"
               : "logit stats fp32 32k (% of copy bandwidth)",
           100.0 * gbs / copy_gbs, 80.0, false, "%");
    } else if (c.rows == 256) {
      Goal("logit stats bf16 [256 x 128k] (% of copy bandwidth)",
           100.0 * gbs / copy_gbs, 80.0, false, "%");
    }

    // The fused cross entropy + z-loss forward and backward on the same
    // logits: reads them (twice: the second sweep mostly from L2) and writes
    // the gradient.
    if (c.dtype == DType::kBFloat16 && c.vocab != 131072) {
      std::vector<int32_t> labels(c.rows);
      for (int64_t r = 0; r < c.rows; ++r)
        labels[r] = static_cast<int32_t>((r * 7919) % c.vocab);
      int32_t* dlabels;
      CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&dlabels),
                            c.rows * sizeof(int32_t)));
      CHECK_CUDA(cudaMemcpy(dlabels, labels.data(), c.rows * sizeof(int32_t),
                            cudaMemcpyHostToDevice));
      std::unique_ptr<CrossEntropyGpu> ce;
      CHECK_OK(CrossEntropyGpu::Create(c.rows, &ce));
      CrossEntropyOptions o;
      o.labels = dlabels;
      o.z_loss_alpha = 1e-4;
      o.grad_logits = dst;
      o.grad_scale = 1.0 / c.rows;
      const double ce_ms =
          MedianMs(stream, [&] { CHECK_OK(ce->Launch(view, o, stream)); });
      std::printf(
          "    fused cross entropy + z-loss fwd/bwd: %.3f ms, %.0f GB/s (read "
          "+ write"
          " grad) = %.1f%% of copy\n",
          ce_ms, 2.0 * bytes / (ce_ms * 1e-3) / 1e9,
          100.0 * (2.0 * bytes / (ce_ms * 1e-3) / 1e9) / copy_gbs);
      // In place (the gradient over the logits), as a trainer that frees
      // the logits would run it.
      CrossEntropyOptions in_place = o;
      in_place.grad_logits = src;
      const double ip_ms = MedianMs(
          stream, [&] { CHECK_OK(ce->Launch(view, in_place, stream)); });
      std::printf("    the same in place: %.3f ms, %.1f%% of copy\n", ip_ms,
                  100.0 * (2.0 * bytes / (ip_ms * 1e-3) / 1e9) / copy_gbs);
      CHECK_CUDA(cudaFree(dlabels));
    }
    CHECK_CUDA(cudaFree(src));
    CHECK_CUDA(cudaFree(dst));
  }
}

}  // namespace

int main() {
  const int devices = CudaDeviceCount();
  if (devices == 0) {
    std::printf("kernels_gpu_bench: no CUDA device; nothing to measure\n");
    return 0;
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, %.0f GiB\n", prop.name,
              prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  GradStatsVsCopy(stream);
  SmallTensorLaunches(stream);
  LogitStatsVsCopy(stream);
  CHECK_CUDA(cudaStreamDestroy(stream));
  std::printf("\n%s\n", failures_of_goals == 0
                            ? "all goals met"
                            : "some goals missed (see above)");
  return 0;
}

#endif  // TRAINWATCH_KERNELS_HAVE_CUDA
