// Cross-rank reduction over NCCL, on the trainer's own CUDA stream: the
// per-step vectors (a few doubles) go to a small device buffer, two
// all-reduces (sum, max) run on the stream, and the result comes back. The
// communicator is either created from a unique id the caller distributes
// (rank 0 makes it with NcclUniqueId(), the job's launcher shares it), or
// borrowed from the trainer, which keeps owning it.
//
// Built only when CUDA and NCCL are found; elsewhere Create* answer
// UNIMPLEMENTED and NcclAvailable() is false. Not thread-safe (one
// training thread per rank, like the rest of the per-step path).

#ifndef TRAINWATCH_AGENT_NCCL_REDUCER_H_
#define TRAINWATCH_AGENT_NCCL_REDUCER_H_

#include <array>
#include <memory>

#include "absl/status/statusor.h"
#include "trainwatch/agent/reducer.h"

namespace trainwatch::agent {

// NCCL's unique id is 128 opaque bytes.
using NcclId = std::array<char, 128>;

bool NcclAvailable();

// A fresh id, to be sent from rank 0 to every rank.
absl::StatusOr<NcclId> NcclUniqueId();

// Creates and owns a communicator for `rank` of `world_size` on CUDA device
// `device`; the collectives run on `stream` (a cudaStream_t; null: the
// default stream).
absl::StatusOr<std::unique_ptr<Reducer>> CreateNcclReducer(const NcclId& id, int rank,
                                                           int world_size, int device,
                                                           void* stream);

// Borrows the trainer's communicator (an ncclComm_t) and stream.
absl::StatusOr<std::unique_ptr<Reducer>> BorrowNcclReducer(void* communicator, void* stream);

}  // namespace trainwatch::agent

#endif  // TRAINWATCH_AGENT_NCCL_REDUCER_H_
