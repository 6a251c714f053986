// A replica's side of fenced run ownership (store/pg/shard_leases.h): wait
// as a standby until every shard is this replica's, then keep the leases
// renewed on a thread of its own, and say once when they are lost.
//
// Phase 1, active/standby: one replica owns every shard. A replica that
// loses any shard (taken by another, or its lease lapsed while it was
// paused or cut off from the database) stops: it can no longer acknowledge
// (the store's fence refuses its writes) and must not page, and a restart
// brings it back as a standby, which is simpler to get right than stepping
// down in place.
#ifndef TRAINWATCH_SERVER_DAEMON_LEASE_KEEPER_H_
#define TRAINWATCH_SERVER_DAEMON_LEASE_KEEPER_H_

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "store/pg/shard_leases.h"

namespace trainwatch::server {

class LeaseKeeper {
 public:
  // Connects its own session to the database `conninfo` (a PostgreSQL
  // conninfo; a multi-host one follows the primary).
  static absl::StatusOr<std::unique_ptr<LeaseKeeper>> Open(const std::string& conninfo,
                                                           const ShardLeaseOptions& options);
  // Stops renewing; with Release() before it, a standby need not wait.
  ~LeaseKeeper();
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  // Tries to take every free shard and extend those owned; true when this
  // replica owns every shard. Each try also notes who owns them (owner()).
  // A database that cannot be reached is reconnected to for the next.
  bool TryOwnership();
  // TryOwnership every lease_ms / 3 until it succeeds; false when `stop`
  // was set first.
  bool AwaitOwnership(const std::atomic<bool>& stop);

  // While standing by: the replica that owns the shards as of the last try
  // ("" when none does, between an owner's death and a takeover); once this
  // replica owns them, its own name. Any thread.
  std::string owner() const;

  // Renews every lease_ms / 3 from now on; `on_lost` runs once, on the
  // keeper's thread, when a renewal finds a shard gone or the local
  // deadline passes without a renewal.
  void StartRenewing(std::function<void(const std::string& why)> on_lost);

  // Gives the shards back for a clean shutdown (stops renewing first).
  absl::Status Release();

  ShardLeases* leases() const { return leases_.get(); }
  // Shard ownerships this replica took, for trainwatch_lease_takeovers_total.
  int64_t takeovers() const { return takeovers_.load(); }

 private:
  explicit LeaseKeeper(std::unique_ptr<ShardLeases> leases);
  void StopRenewing();

  std::unique_ptr<ShardLeases> leases_;
  std::atomic<int64_t> takeovers_{0};
  mutable std::mutex mu_;
  std::string owner_;   // guarded by mu_
  bool said_ = false;   // guarded by mu_: the first try was logged
  std::condition_variable wake_;
  bool stopping_ = false;  // guarded by mu_
  std::thread renewer_;
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_DAEMON_LEASE_KEEPER_H_
