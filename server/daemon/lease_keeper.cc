#include "daemon/lease_keeper.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace trainwatch::server {

LeaseKeeper::LeaseKeeper(std::unique_ptr<ShardLeases> leases) : leases_(std::move(leases)) {}

LeaseKeeper::~LeaseKeeper() { StopRenewing(); }

absl::StatusOr<std::unique_ptr<LeaseKeeper>> LeaseKeeper::Open(
    const std::string& conninfo, const ShardLeaseOptions& options) {
  auto leases = ShardLeases::Open(conninfo, options);
  if (!leases.ok()) return leases.status();
  return std::unique_ptr<LeaseKeeper>(new LeaseKeeper(std::move(*leases)));
}

bool LeaseKeeper::TryOwnership() {
  const int before = leases_->owned();
  auto owned = leases_->AcquireAll();
  if (owned.ok()) takeovers_ += std::max(0, *owned - before);
  if (owned.ok() && *owned == leases_->shards()) {
    std::lock_guard<std::mutex> lock(mu_);
    owner_ = leases_->options().holder;
    return true;
  }
  absl::StatusOr<std::vector<std::string>> holders =
      owned.ok() ? leases_->Holders() : absl::StatusOr<std::vector<std::string>>(owned.status());
  if (holders.ok()) {
    // Another replica: this one may hold some shards on its way to all.
    std::string owner;
    for (const std::string& h : *holders) {
      if (h != leases_->options().holder) {
        owner = h;
        break;
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (owner != owner_ || !said_) {
      LOG(INFO) << "standby: " << *owned << " of " << leases_->shards()
                << " shards free; the owner is "
                << (owner.empty() ? std::string("nobody (a takeover is due)") : owner);
    }
    owner_ = owner;
  } else {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!said_) {
        LOG(INFO) << "standby: the lease table cannot be read (" << holders.status()
                  << "); retrying";
      }
    }
    // A connection lost to a database failover is made again: the
    // conninfo's hosts are tried anew.
    leases_->Reconnect().IgnoreError();
  }
  std::lock_guard<std::mutex> lock(mu_);
  said_ = true;
  return false;
}

bool LeaseKeeper::AwaitOwnership(const std::atomic<bool>& stop) {
  const auto every = std::chrono::milliseconds(leases_->options().lease_ms / 3);
  while (!stop.load()) {
    if (TryOwnership()) return true;
    std::unique_lock<std::mutex> lock(mu_);
    wake_.wait_for(lock, every, [&] { return stopping_ || stop.load(); });
  }
  return false;
}

std::string LeaseKeeper::owner() const {
  std::lock_guard<std::mutex> lock(mu_);
  return owner_;
}

void LeaseKeeper::StartRenewing(std::function<void(const std::string& why)> on_lost) {
  renewer_ = std::thread([this, on_lost = std::move(on_lost)] {
    const auto every = std::chrono::milliseconds(leases_->options().lease_ms / 3);
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (wake_.wait_for(lock, every, [&] { return stopping_; })) return;
      }
      auto owned = leases_->AcquireAll();
      if (!owned.ok()) leases_->Reconnect().IgnoreError();
      std::string why;
      if (owned.ok() && *owned < leases_->shards()) {
        why = absl::StrCat("another replica took ", leases_->shards() - *owned, " of ",
                           leases_->shards(), " shards");
      } else if (!leases_->MayAcknowledge(0)) {
        why = absl::StrCat("the lease lapsed without a renewal (",
                           owned.ok() ? "renewed too late" : owned.status().ToString(), ")");
      }
      if (!why.empty()) {
        on_lost(why);
        return;
      }
    }
  });
}

void LeaseKeeper::StopRenewing() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (renewer_.joinable()) renewer_.join();
}

absl::Status LeaseKeeper::Release() {
  StopRenewing();
  return leases_->Release();
}

}  // namespace trainwatch::server
