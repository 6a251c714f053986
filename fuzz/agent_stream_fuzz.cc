// The agent stream's message handling in trainwatchd, from bytes to the
// store: the input is what one stream carries, a sequence of messages each
// framed as a varint length and a serialized trainwatch.v1.AgentMessage (the
// framing gRPC gives the stream, minus HTTP/2). Each message is parsed and
// checked as AgentStream does; one that fails to parse or is refused ends
// the stream, as there. The accepted ones go to an Ingestor over an
// in-memory store, on a fake clock that moves a second per message (so
// per-rank steps time out), and Flush() waits until they are written.

#include <memory>
#include <string>

#include "admission/agent_message_checks.h"
#include "fuzz_target.h"
#include "google/protobuf/io/coded_stream.h"
#include "ingest/ingest.h"
#include "store/store.h"
#include "testing/fake_clock.h"

namespace {

// A bound on the work one input can ask for, to keep executions fast.
constexpr int kMaxMessages = 64;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace server = trainwatch::server;
  absl::StatusOr<std::unique_ptr<server::Store>> store = server::Store::Open(":memory:");
  FUZZ_CHECK(store.ok());
  trainwatch::testing::FakeClock clock;
  server::IngestOptions options;
  options.aggregation_timeout_ms = 5'000;
  server::Ingestor ingestor(store->get(), options, &clock);
  ingestor.Start();

  // Authentication off: the token scope and quota checks, the stream's
  // others, have nothing to refuse.
  server::AgentStreamProgress progress;
  const server::AgentStreamLimits limits;
  google::protobuf::io::CodedInputStream in(data, static_cast<int>(size));
  for (int i = 0; i < kMaxMessages; ++i) {
    uint32_t length = 0;
    std::string bytes;
    if (!in.ReadVarint32(&length) || !in.ReadString(&bytes, static_cast<int>(length))) break;
    server::IngestItem item;
    if (!item.message.ParseFromString(bytes)) break;
    // The stream's checks; the call the stream makes in OnReadDone().
    if (!server::CheckAgentMessage(item.message, progress, limits).ok()) break;
    progress.hello_seen = progress.hello_seen || item.message.has_hello();
    item.stream_id = 1;
    item.received_ms = clock.NowMs();
    ingestor.Submit(std::move(item));
    clock.AdvanceMs(1'000);
  }
  ingestor.Flush();
  ingestor.Stop();
  return 0;
}
