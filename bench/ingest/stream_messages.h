// The messages a simulated agent stream sends: its Hello, its heartbeats and
// the step reports of a healthy run. Pure: each call overwrites *out.

#ifndef TRAINWATCH_BENCH_INGEST_STREAM_MESSAGES_H_
#define TRAINWATCH_BENCH_INGEST_STREAM_MESSAGES_H_

#include <cstdint>

#include "stream_plan.h"
#include "trainwatch/v1/agent.pb.h"

namespace trainwatch::bench {

inline constexpr char kLoadAgentVersion[] = "tw-ingest-load/0.1.0";

// The Hello that opens the stream; the stream resumes at step 1.
void FillHello(const StreamPlan& plan, trainwatch::v1::AgentMessage* out);

// A heartbeat that reports last_sent - acked records queued in a queue of
// queue_capacity.
void FillHeartbeat(const StreamPlan& plan, int64_t last_sent, int64_t acked,
                   uint32_t queue_capacity, trainwatch::v1::AgentMessage* out);

// The stream's record for `step`: a slowly converging run whose metrics
// differ per run and rank, so that no rule should fire.
void FillStepReport(const StreamPlan& plan, int64_t step, trainwatch::v1::AgentMessage* out);

}  // namespace trainwatch::bench

#endif  // TRAINWATCH_BENCH_INGEST_STREAM_MESSAGES_H_
