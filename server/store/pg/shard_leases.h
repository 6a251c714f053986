// Fenced run ownership on PostgreSQL: each run hashes to one of a fixed
// number of shards, and a logged table `shard_lease(shard, holder, epoch,
// expires_at_ms)` gives each shard one owner at a time.
//
// Why it is safe with two replicas on one database:
//   - Taking a shard (its lease expired by the database's clock, or already
//     ours) bumps its epoch in the same UPDATE, so each ownership has an
//     epoch of its own, and the row is in the WAL: it survives a failover
//     of the database, unlike an advisory lock.
//   - The owner's every write transaction first reads its shards' rows
//     FOR SHARE (CheckFence) and aborts when an epoch is no longer its own.
//     A takeover's UPDATE waits for such a transaction in flight, so the old
//     owner either commits before the epoch changes or sees the change.
//   - The owner stops acknowledging before its lease can expire
//     (MayAcknowledge): its deadline runs on its own monotonic clock from
//     the moment it *sent* the renewal that succeeded, minus a margin, so it
//     falls before the expiry the database computed later. A paused or
//     partitioned owner thus fences itself without hearing from anyone.
// Expiry is judged by the database's clock alone, so replicas' wall clocks
// need not agree; after a database failover the new primary's clock judges,
// which is why the lease should be long against the skew NTP leaves.
//
// One thread at a time (the owner's lease loop); MayAcknowledge and the
// read accessors may be called from any thread.
#ifndef TRAINWATCH_SERVER_STORE_PG_SHARD_LEASES_H_
#define TRAINWATCH_SERVER_STORE_PG_SHARD_LEASES_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "trainwatch/core/clock.h"

namespace trainwatch::server {

class PgConnection;

struct ShardLeaseOptions {
  // This replica's name in the table: what a non-owner names as the owner.
  // Never an alert label (alerts must not change with the owner).
  std::string holder;
  // Fixed for the life of the database: every replica must agree, and
  // Open() refuses a table made with another count.
  int shards = 64;
  // How long a renewal keeps a shard, by the database's clock.
  int64_t lease_ms = 10'000;
  // Taken off the local deadline, against a monotonic clock that runs a
  // little slower than the database's.
  int64_t margin_ms = 1'000;
};

class ShardLeases {
 public:
  // Connects a session of its own to `conninfo` and creates the table and
  // its rows if missing. `monotonic` must be a monotonic clock (nullptr: the
  // process's steady clock) and outlive the object.
  static absl::StatusOr<std::unique_ptr<ShardLeases>> Open(const std::string& conninfo,
                                                           const ShardLeaseOptions& options,
                                                           core::Clock* monotonic = nullptr);
  ~ShardLeases();
  ShardLeases(const ShardLeases&) = delete;
  ShardLeases& operator=(const ShardLeases&) = delete;

  // The shard of a run: a stable hash, the same in every replica and
  // version (FNV-1a 64 of the run id).
  static int ShardOf(absl::string_view run_id, int shards);

  // Takes every shard that is free (never held, or expired by the
  // database's clock) and extends those already ours: phase 1, one replica
  // owns everything and the others stand by. A shard whose epoch moved
  // under us is dropped. Returns the number of shards owned after it; on an
  // error (the database unreachable) nothing is extended and the local
  // deadline runs on.
  absl::StatusOr<int> AcquireAll();

  // The holders whose leases are live by the database's clock, the one
  // owning most shards first: whom a standby names as the owner (phase 1:
  // one, or none between an owner's death and a takeover).
  absl::StatusOr<std::vector<std::string>> Holders();

  // Gives every owned shard back (expired now, epoch kept), for a clean
  // shutdown: a standby takes over without waiting out the lease.
  absl::Status Release();

  // Whether this holder may still acknowledge writes to `shard`: it owns the
  // shard and its local deadline has not passed.
  bool MayAcknowledge(int shard) const;
  // Shards owned, whatever the deadline (for metrics).
  int owned() const;
  // The epoch this holder owns `shard` at; 0 when it does not.
  int64_t epoch(int shard) const;
  int shards() const { return options_.shards; }
  const ShardLeaseOptions& options() const { return options_; }

  // A new session with the same conninfo, after one was lost (a database
  // failover: a multi-host conninfo reaches the new primary). What this
  // holder owns is unchanged: the rows say, at the next AcquireAll.
  absl::Status Reconnect();

  // Inside a transaction the caller opened on `conn`: reads the rows of
  // `shards` FOR SHARE and fails with AbortedError, naming the holder that
  // now owns one, unless this holder owns each at its epoch and its deadline
  // has not passed. A takeover then waits for the caller's commit.
  absl::Status CheckFence(PgConnection& conn, absl::Span<const int> shards) const;

 private:
  ShardLeases(std::string conninfo, const ShardLeaseOptions& options, core::Clock* monotonic);
  absl::Status CreateTable();

  const std::string conninfo_;
  std::unique_ptr<PgConnection> conn_;
  const ShardLeaseOptions options_;
  core::Clock* const monotonic_;
  mutable absl::Mutex mu_;
  std::vector<int64_t> epochs_ ABSL_GUARDED_BY(mu_);  // per shard, 0: not ours
  // Monotonic ms after which nothing is acknowledged; one for all shards,
  // since they are renewed together.
  int64_t deadline_ms_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_STORE_PG_SHARD_LEASES_H_
