// A host simulation of GradStatsGpuPlan's two kernels: the partition of
// gpu_partition.h and the kernels' own index functions (IsWideBlock,
// ShapeOfWalk, WalkThread, FinalizeGrid, FinalizeTensorOf), driven over
// every block, warp and thread of the grid on the CPU. Only the arithmetic on
// the loaded values differs from the GPU (fp64 throughout here), so the
// result must match the reference to fp64 rounding; any element read twice,
// missed or read out of bounds, and any partial or tensor result written
// twice or never, is reported.
//
// Two modes:
//   - data: elements are read from host memory (views of host buffers);
//   - indexing only (`constant` set): nothing is read, element i of tensor t
//     counts as the value constant[t], so the plan of tensors far larger than
//     this machine's memory (fake, never dereferenced pointers) can be walked
//     and checked against a closed-form reference.

#ifndef TRAINWATCH_TESTS_KERNELS_GPU_SIM_H_
#define TRAINWATCH_TESTS_KERNELS_GPU_SIM_H_

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "gpu_partition.h"
#include "trainwatch/kernels/grad_stats.h"
#include "trainwatch/kernels/reference.h"

namespace trainwatch::kernels::testing {

struct SimResult {
  GradStats stats;
  // Empty when every index invariant held, else the first violations.
  std::string errors;
  int64_t elements_visited = 0;
};

namespace sim_internal {

struct Partial {
  double sum = 0.0;
  int64_t bad = 0;
  double max = 0.0;
  int writes = 0;
};

class Errors {
 public:
  template <typename... Args>
  void Add(const Args&... args) {
    if (count_++ >= 5) return;
    std::ostringstream os;
    (os << ... << args);
    text_ += os.str() + "; ";
  }
  std::string Take() {
    if (count_ > 5) text_ += std::to_string(count_ - 5) + " more";
    return text_;
  }

 private:
  int count_ = 0;
  std::string text_;
};

// One thread's share of segment `seg`: visits through WalkThread, then the
// per-element arithmetic of the reference.
template <int kStride, int kUnroll>
void SimThread(const internal::GpuSegment& seg, int tid, const double* constant,
               std::vector<uint16_t>* visits, Partial* p, int64_t* visited,
               Errors* errors) {
  const DType dtype = static_cast<DType>(seg.dtype);
  const int esize = static_cast<int>(DTypeSize(dtype));
  const int per_vec = 16 / esize;
  const internal::WalkShape shape =
      internal::ShapeOfWalk(reinterpret_cast<uintptr_t>(seg.data), seg.numel,
                            esize);
  const auto element = [&](int64_t i) {
    if (i < 0 || i >= seg.numel) {
      errors->Add("segment of tensor ", seg.tensor, ": element ", i,
                  " outside [0, ", seg.numel, ")");
      return;
    }
    ++*visited;
    if (visits != nullptr) ++(*visits)[static_cast<size_t>(i)];
    const double x = constant != nullptr ? constant[seg.tensor]
                                         : LoadAsDouble(seg.data, dtype, i);
    if (!std::isfinite(x)) {
      ++p->bad;
      return;
    }
    p->sum += x * x;
    p->max = std::fmax(p->max, std::fabs(x));
  };
  const auto vector = [&](int64_t v) {
    if (v < 0 || v >= shape.nvec) {
      errors->Add("segment of tensor ", seg.tensor, ": vector ", v,
                  " outside [0, ", shape.nvec, ")");
      return;
    }
    const int64_t first = shape.head + v * per_vec;
    const uintptr_t addr =
        reinterpret_cast<uintptr_t>(seg.data) + first * esize;
    if (addr % 16 != 0) {
      errors->Add("segment of tensor ", seg.tensor, ": vector ", v,
                  " misaligned");
    }
    if (constant != nullptr && visits == nullptr) {
      // Indexing only and large: count the vector as a whole.
      *visited += per_vec;
      const double x = constant[seg.tensor];
      if (!std::isfinite(x)) {
        p->bad += per_vec;
      } else {
        p->sum += per_vec * x * x;
        p->max = std::fmax(p->max, std::fabs(x));
      }
      return;
    }
    for (int k = 0; k < per_vec; ++k) element(first + k);
  };
  internal::WalkThread<kStride, kUnroll>(
      shape, seg.numel, tid, element,
      [&](int64_t v) {
        for (int u = 0; u < kUnroll; ++u) vector(v + u * kStride);
      },
      vector);
}

inline void SimSegment(const internal::GpuSegment& seg, int threads, bool wide,
                       const double* constant, bool check_each_element,
                       Partial* p, int64_t* visited, Errors* errors) {
  std::vector<uint16_t> visits;
  if (check_each_element) visits.assign(static_cast<size_t>(seg.numel), 0);
  std::vector<uint16_t>* v = check_each_element ? &visits : nullptr;
  for (int tid = 0; tid < threads; ++tid) {
    Partial t;
    if (wide) {
      SimThread<internal::kPartialThreads, internal::kWideUnroll>(
          seg, tid, constant, v, &t, visited, errors);
    } else {
      SimThread<32, internal::kPackedUnroll>(seg, tid, constant, v, &t,
                                             visited, errors);
    }
    p->sum += t.sum;
    p->bad += t.bad;
    p->max = std::fmax(p->max, t.max);
  }
  for (size_t i = 0; i < visits.size(); ++i) {
    if (visits[i] != 1) {
      errors->Add("segment of tensor ", seg.tensor, ": element ", i, " read ",
                  visits[i], " times");
    }
  }
}

}  // namespace sim_internal

// Runs the plan for `tensors` as the GPU would. `constant`: null to read the
// data, else one value per tensor (indexing only). check_each_element: also
// count the reads of every element (costs memory per segment only).
inline SimResult SimulateGradStatsPlan(const std::vector<TensorView>& tensors,
                                       bool per_tensor, const double* constant,
                                       bool check_each_element = true) {
  using sim_internal::Partial;
  SimResult out;
  sim_internal::Errors errors;
  internal::GpuPartition part;
  internal::BuildGpuPartition(tensors.data(), tensors.size(), &part);
  const int64_t nseg = static_cast<int64_t>(part.segs.size());
  std::vector<Partial> seg(static_cast<size_t>(nseg));

  // Kernel 1: one CUDA block per GpuBlock.
  for (const internal::GpuBlock& b : part.blocks) {
    if (b.seg_begin < 0 || b.seg_end > nseg || b.seg_begin >= b.seg_end) {
      errors.Add("block [", b.seg_begin, ", ", b.seg_end, ") out of range");
      continue;
    }
    if (internal::IsWideBlock(b, part.segs[b.seg_begin])) {
      Partial& p = seg[b.seg_begin];
      sim_internal::SimSegment(part.segs[b.seg_begin],
                               internal::kPartialThreads, true, constant,
                               check_each_element, &p, &out.elements_visited,
                               &errors);
      ++p.writes;
      continue;
    }
    for (int warp = 0; warp < internal::kPartialWarps; ++warp) {
      for (int32_t k = b.seg_begin + warp; k < b.seg_end;
           k += internal::kPartialWarps) {
        Partial& p = seg[k];
        sim_internal::SimSegment(part.segs[k], 32, false, constant,
                                 check_each_element, &p, &out.elements_visited,
                                 &errors);
        ++p.writes;
      }
    }
  }
  for (int64_t k = 0; k < nseg; ++k) {
    if (seg[k].writes != 1) {
      errors.Add("segment ", k, " partial written ", seg[k].writes, " times");
    }
  }

  // Kernel 2: the finalize grid.
  const int64_t ntensors = static_cast<int64_t>(tensors.size());
  const int64_t grid = internal::FinalizeGrid(ntensors, per_tensor);
  GradStats& st = out.stats;
  st.numel = part.numel;
  for (int64_t s = 0; s < nseg; ++s) {
    st.sum_squares += seg[s].sum;
    st.nonfinite += seg[s].bad;
    st.max_abs = std::fmax(st.max_abs, seg[s].max);
  }
  const size_t n = per_tensor ? tensors.size() : 0;
  st.tensor_sum_squares.assign(n, 0.0);
  st.tensor_nonfinite.assign(n, 0);
  st.tensor_max_abs.assign(n, 0.0);
  std::vector<int> tensor_writes(n, 0);
  for (int64_t block = 1; block < grid; ++block) {
    for (int warp = 0; warp < internal::kFinalThreads / 32; ++warp) {
      const int64_t t = internal::FinalizeTensorOf(block, warp);
      if (t >= ntensors) continue;
      if (t < 0) {
        errors.Add("finalize block ", block, " warp ", warp, ": tensor ", t);
        continue;
      }
      ++tensor_writes[t];
      for (int lane = 0; lane < 32; ++lane) {
        for (int64_t s = part.tensor_seg_begin[t] + lane;
             s < part.tensor_seg_begin[t + 1]; s += 32) {
          st.tensor_sum_squares[t] += seg[s].sum;
          st.tensor_nonfinite[t] += seg[s].bad;
          st.tensor_max_abs[t] = std::fmax(st.tensor_max_abs[t], seg[s].max);
        }
      }
    }
  }
  for (size_t t = 0; t < n; ++t) {
    if (tensor_writes[t] != 1) {
      errors.Add("tensor ", t, " finalized ", tensor_writes[t], " times");
    }
  }
  out.errors = errors.Take();
  return out;
}

}  // namespace trainwatch::kernels::testing

#endif  // TRAINWATCH_TESTS_KERNELS_GPU_SIM_H_
