#include "store/pg/shard_leases.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "store/pg/pg_connection.h"

namespace trainwatch::server {
namespace {

core::Clock* SteadyClock() {
  class Steady final : public core::Clock {
   public:
    int64_t NowMs() const override {
      return std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::steady_clock::now().time_since_epoch())
          .count();
    }
  };
  static Steady* const clock = new Steady;
  return clock;
}

// The database's time in ms: expiry is judged by one clock, the primary's.
constexpr char kDbNowMs[] = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

// A bigint[] parameter in text form, indexed by shard + 1 in SQL.
std::string EpochArray(const std::vector<int64_t>& epochs) {
  return absl::StrCat("{", absl::StrJoin(epochs, ","), "}");
}

}  // namespace

ShardLeases::ShardLeases(std::string conninfo, const ShardLeaseOptions& options,
                         core::Clock* monotonic)
    : conninfo_(std::move(conninfo)),
      options_(options),
      monotonic_(monotonic != nullptr ? monotonic : SteadyClock()),
      epochs_(static_cast<size_t>(options.shards), 0) {}

ShardLeases::~ShardLeases() = default;

absl::StatusOr<std::unique_ptr<ShardLeases>> ShardLeases::Open(
    const std::string& conninfo, const ShardLeaseOptions& options, core::Clock* monotonic) {
  if (options.holder.empty()) return absl::InvalidArgumentError("a lease holder needs a name");
  if (options.shards < 1) return absl::InvalidArgumentError("shards must be >= 1");
  if (options.lease_ms <= 0 || options.margin_ms < 0 || options.margin_ms >= options.lease_ms) {
    return absl::InvalidArgumentError("need lease_ms > margin_ms >= 0");
  }
  std::unique_ptr<ShardLeases> leases(new ShardLeases(conninfo, options, monotonic));
  if (absl::Status s = leases->Reconnect(); !s.ok()) return s;
  if (absl::Status s = leases->CreateTable(); !s.ok()) return s;
  return leases;
}

absl::Status ShardLeases::Reconnect() {
  auto conn = PgConnection::Connect(conninfo_);
  if (!conn.ok()) return conn.status();
  conn_ = std::move(*conn);
  return absl::OkStatus();
}

absl::Status ShardLeases::CreateTable() {
  // Two replicas starting together may race on CREATE TABLE IF NOT EXISTS
  // (a unique violation in the catalog): the loser finds the table the
  // second time.
  for (int attempt = 0;; ++attempt) {
    auto made = conn_->Execute(
        "CREATE TABLE IF NOT EXISTS shard_lease (shard integer PRIMARY KEY, "
        "holder text NOT NULL, epoch bigint NOT NULL, expires_at_ms bigint NOT NULL)");
    if (made.ok()) break;
    if (attempt > 0 || !absl::IsAlreadyExists(made.status())) return made.status();
  }
  // The count is fixed when the table is first filled: a replica
  // configured with another would hash runs to shards nobody else owns.
  auto count = conn_->Execute("SELECT count(*) FROM shard_lease");
  if (!count.ok()) return count.status();
  if (count->Int(0, 0) == 0) {
    auto rows = conn_->Execute(
        "INSERT INTO shard_lease SELECT s, '', 0, 0 "
        "FROM generate_series(0, $1::integer - 1) s ON CONFLICT (shard) DO NOTHING",
        {options_.shards});
    if (!rows.ok()) return rows.status();
    count = conn_->Execute("SELECT count(*) FROM shard_lease");
    if (!count.ok()) return count.status();
  }
  if (count->Int(0, 0) != options_.shards) {
    return absl::FailedPreconditionError(
        absl::StrCat("the database's shard_lease table has ", count->Text(0, 0),
                     " shards and this replica was configured with ", options_.shards,
                     ": every replica must use the count the table was made with"));
  }
  return absl::OkStatus();
}

int ShardLeases::ShardOf(absl::string_view run_id, int shards) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : run_id) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return static_cast<int>(h % static_cast<uint64_t>(shards));
}

absl::StatusOr<int> ShardLeases::AcquireAll() {
  std::vector<int64_t> mine;
  {
    absl::MutexLock lock(&mu_);
    mine = epochs_;
  }
  // Sent before the statement: the database's expiry, computed later, is at
  // least this plus lease_ms.
  const int64_t sent_ms = monotonic_->NowMs();
  // A shard is ours to keep at its epoch while the row still names us at
  // the epoch we hold and has not expired; expired, or free, it is taken at
  // a new epoch. A row naming us at another epoch (a previous process of
  // this replica) waits out its lease like anyone's.
  auto rows = conn_->Execute(
      absl::StrCat("WITH now AS (SELECT ", kDbNowMs,
                   " AS ms) "
                   "UPDATE shard_lease l SET "
                   "epoch = CASE WHEN l.holder = $1 AND l.epoch = ($3::bigint[])[l.shard + 1] "
                   "AND l.expires_at_ms >= now.ms THEN l.epoch ELSE l.epoch + 1 END, "
                   "holder = $1, expires_at_ms = now.ms + $2::bigint "
                   "FROM now WHERE (l.holder = $1 AND l.epoch = ($3::bigint[])[l.shard + 1]) "
                   "OR l.expires_at_ms < now.ms "
                   "RETURNING l.shard, l.epoch"),
      {options_.holder, options_.lease_ms, EpochArray(mine)});
  if (!rows.ok()) return rows.status();
  std::vector<int64_t> epochs(static_cast<size_t>(options_.shards), 0);
  for (int r = 0; r < rows->rows(); ++r) {
    const std::optional<int64_t> shard = rows->Int(r, 0), epoch = rows->Int(r, 1);
    if (!shard || !epoch || *shard < 0 || *shard >= options_.shards) {
      return absl::InternalError("shard_lease returned a row out of range");
    }
    epochs[static_cast<size_t>(*shard)] = *epoch;
  }
  absl::MutexLock lock(&mu_);
  epochs_ = std::move(epochs);
  deadline_ms_ = sent_ms + options_.lease_ms - options_.margin_ms;
  return rows->rows();
}

absl::StatusOr<std::vector<std::string>> ShardLeases::Holders() {
  auto rows = conn_->Execute(absl::StrCat("SELECT holder FROM shard_lease WHERE expires_at_ms >= ",
                                          kDbNowMs,
                                          " GROUP BY holder ORDER BY count(*) DESC, holder"));
  if (!rows.ok()) return rows.status();
  std::vector<std::string> holders;
  for (int r = 0; r < rows->rows(); ++r) holders.push_back(rows->Text(r, 0));
  return holders;
}

absl::Status ShardLeases::Release() {
  std::vector<int64_t> mine;
  {
    absl::MutexLock lock(&mu_);
    mine = epochs_;
    std::fill(epochs_.begin(), epochs_.end(), 0);
    deadline_ms_ = 0;  // fenced before the rows say so
  }
  auto rows = conn_->Execute(
      "UPDATE shard_lease SET expires_at_ms = 0 "
      "WHERE holder = $1 AND epoch = ($2::bigint[])[shard + 1]",
      {options_.holder, EpochArray(mine)});
  return rows.status();
}

bool ShardLeases::MayAcknowledge(int shard) const {
  if (shard < 0 || shard >= options_.shards) return false;
  const int64_t now = monotonic_->NowMs();
  absl::MutexLock lock(&mu_);
  return epochs_[static_cast<size_t>(shard)] != 0 && now < deadline_ms_;
}

int ShardLeases::owned() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (int64_t e : epochs_) n += e != 0;
  return n;
}

int64_t ShardLeases::epoch(int shard) const {
  if (shard < 0 || shard >= options_.shards) return 0;
  absl::MutexLock lock(&mu_);
  return epochs_[static_cast<size_t>(shard)];
}

absl::Status ShardLeases::CheckFence(PgConnection& conn, absl::Span<const int> of) const {
  std::vector<int> shards(of.begin(), of.end());
  std::sort(shards.begin(), shards.end());
  shards.erase(std::unique(shards.begin(), shards.end()), shards.end());
  if (shards.empty()) return absl::OkStatus();
  for (int s : shards) {
    if (!MayAcknowledge(s)) {
      return absl::AbortedError(
          absl::StrCat("fenced: this replica's lease on shard ", s, " lapsed or was never taken"));
    }
  }
  auto rows = conn.Execute(
      "SELECT shard, holder, epoch FROM shard_lease WHERE shard = ANY($1::integer[]) "
      "ORDER BY shard FOR SHARE",
      {absl::StrCat("{", absl::StrJoin(shards, ","), "}")});
  if (!rows.ok()) return rows.status();
  for (int r = 0; r < rows->rows(); ++r) {
    const int shard = static_cast<int>(rows->Int(r, 0).value_or(-1));
    const std::string holder = rows->Text(r, 1);
    const int64_t epoch = rows->Int(r, 2).value_or(-1);
    if (holder != options_.holder || epoch != this->epoch(shard)) {
      return absl::AbortedError(absl::StrCat("fenced: shard ", shard, " is owned by ", holder,
                                             " at epoch ", epoch));
    }
  }
  if (rows->rows() != static_cast<int>(shards.size())) {
    return absl::AbortedError("fenced: a shard's lease row is missing");
  }
  return absl::OkStatus();
}

}  // namespace trainwatch::server
