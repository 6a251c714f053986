// The writer's queue and its group commit, and the batch it fills, each
// constructed alone: no store, no thread but the test's.

#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "ingest/batch.h"
#include "ingest/ingest_queue.h"

namespace trainwatch::server {
namespace {

IngestItem Step(uint64_t stream, int64_t step) {
  IngestItem item;
  item.stream_id = stream;
  item.message.mutable_step_report()->set_run_id("r");
  item.message.mutable_step_report()->set_step(step);
  return item;
}

TEST_CASE("ingest queue: takes at most a batch - the rest waits for the next take",
          "[server][ingest_queue]") {
  IngestQueue q(/*max_batch_items=*/3, /*commit_interval_ms=*/0);
  for (int64_t s = 0; s < 5; ++s) q.Submit(Step(1, s));
  CHECK(q.Depth() == 5);
  std::vector<IngestItem> items;
  std::vector<ApprovalTask> tasks;
  CHECK_FALSE(q.Take(/*busy=*/true, &items, &tasks));
  REQUIRE(items.size() == 3);
  CHECK(items[2].message.step_report().step() == 2);
  CHECK_FALSE(q.Done(items.size()));  // two left
  items.clear();
  q.Take(true, &items, &tasks);
  CHECK(items.size() == 2);
  CHECK(q.Done(items.size()));
  CHECK(q.Depth() == 0);
}

TEST_CASE("ingest queue: Flush returns once what was submitted is done - and after the close",
          "[server][ingest_queue]") {
  IngestQueue q(100, /*commit_interval_ms=*/60'000);  // a linger Flush must cut short
  q.Submit(Step(1, 0));
  std::thread writer([&] {
    std::vector<IngestItem> items;
    std::vector<ApprovalTask> tasks;
    q.Take(false, &items, &tasks);
    q.Done(items.size());
  });
  q.Flush();
  writer.join();
  CHECK(q.Stop());
  CHECK_FALSE(q.Stop());  // once
  q.Submit(Step(1, 1));   // never taken: the writer is gone
  q.Closed();
  q.Flush();  // does not wait
}

TEST_CASE("batch: an ack keeps the highest step per stream - run and rank",
          "[server][batch]") {
  Batch b;
  CHECK(b.empty());
  b.Ack(1, "r", 0, 5);
  b.Ack(1, "r", 0, 3);
  b.Ack(2, "r", 0, 4);
  CHECK(b.acks.size() == 2);
  CHECK(b.acks.begin()->second == 5);
  b.ids.next_decision = 9;
  b.rows.runs.emplace_back();
  CHECK_FALSE(b.empty());
  b.Clear();
  CHECK(b.empty());
  CHECK(b.ids.next_decision == 9);  // ids outlive a batch
}

}  // namespace
}  // namespace trainwatch::server
