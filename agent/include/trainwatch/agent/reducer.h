// Cross-rank reduction of the per-step statistics, so that every rank feeds
// the rule engine the same global numbers and reaches the same verdict.
// One tiny collective per step: a handful of doubles summed, a few maxed.
//
// Implementations: SingleProcessReducer (one rank), CallbackReducer (the
// trainer's own collective, e.g. torch.distributed.all_reduce), and
// NcclReducer (nccl_reducer.h, built with CUDA and NCCL). Every rank must
// receive bit-identical results; all three guarantee it (NCCL and
// torch.distributed broadcast one reduced value to every rank).

#ifndef TRAINWATCH_AGENT_REDUCER_H_
#define TRAINWATCH_AGENT_REDUCER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace trainwatch::agent {

class Reducer {
 public:
  virtual ~Reducer() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // In place: `sums` summed over ranks, `maxes` maxed over ranks. The spans
  // have the same sizes on every rank. REQUIRES: every rank calls it once per
  // step, in the same order (it is a collective).
  virtual absl::Status AllReduce(absl::Span<double> sums, absl::Span<double> maxes) = 0;

  // The same collective on device memory, in place, enqueued on the
  // reducer's stream with no host copy and no synchronization: a GPU result
  // (e.g. trainwatch::kernels::GradStatsGpuPlan::device_result()) is reduced
  // before its one read-back, so a step pays one sync, not two. `sums`:
  // n_sums doubles summed; `counts`: n_counts uint64 summed; `maxes`:
  // n_maxes doubles maxed. The default answers UNIMPLEMENTED (reducers that
  // only see host memory); NcclReducer implements it.
  virtual absl::Status AllReduceDevice(double* /*sums*/, size_t /*n_sums*/,
                                       uint64_t* /*counts*/, size_t /*n_counts*/,
                                       double* /*maxes*/, size_t /*n_maxes*/) {
    return absl::UnimplementedError("this reducer does not reduce device memory");
  }
};

class SingleProcessReducer : public Reducer {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  absl::Status AllReduce(absl::Span<double>, absl::Span<double>) override {
    return absl::OkStatus();
  }
};

// The trainer's collective. `fn` receives the two spans and must reduce
// them in place across its process group (sum, then max).
class CallbackReducer : public Reducer {
 public:
  using Fn = std::function<absl::Status(absl::Span<double> sums, absl::Span<double> maxes)>;
  CallbackReducer(int rank, int world_size, Fn fn)
      : rank_(rank), world_size_(world_size), fn_(std::move(fn)) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  absl::Status AllReduce(absl::Span<double> sums, absl::Span<double> maxes) override {
    return fn_(sums, maxes);
  }

 private:
  int rank_;
  int world_size_;
  Fn fn_;
};

// Ranks as threads of one process, for tests and single-host simulations:
// a reusable barrier-based all-reduce. Thread-safe.
class InProcessGroup {
 public:
  explicit InProcessGroup(int world_size);
  ~InProcessGroup();
  // The reducer of one rank; REQUIRES: 0 <= rank < world_size.
  std::unique_ptr<Reducer> ReducerFor(int rank);

  struct Shared;  // defined in reducer.cc

 private:
  std::shared_ptr<Shared> shared_;
};

}  // namespace trainwatch::agent

#endif  // TRAINWATCH_AGENT_REDUCER_H_
