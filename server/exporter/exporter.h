// The Prometheus exporter: every /metrics scrape reads the live state (the
// run table's views, the ingestor's stats, the open streams, the pager's counters),
// so there are no shadow counters to keep in step.

#ifndef TRAINWATCH_SERVER_EXPORTER_H_
#define TRAINWATCH_SERVER_EXPORTER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ingest/run_views.h"
#include "store/store.h"

// Declared only: server.h carries ExporterOptions without prometheus-cpp's
// headers.
namespace prometheus {
class Collectable;
struct MetricFamily;
}  // namespace prometheus

namespace trainwatch::server {

class ServiceState;

// A replica's leases as /metrics shows them (trainwatchd --replica), read
// at each scrape: the daemon, which keeps the leases, supplies them, so the
// exporter knows nothing of how.
struct LeaseFigures {
  int64_t shards_owned = 0;
  int64_t shards_total = 0;
  int64_t epoch = 0;  // the highest epoch of a shard it owns
  int64_t takeovers = 0;
};

// What keeps /metrics bounded however many run ids agents send: each run
// exported has at most 18 series (the gauges, the incident counts by tier),
// so a scrape has at most 18 * max_runs of them plus the server's own.
struct ExporterOptions {
  // A run not seen for this long leaves /metrics (it stays in the store and
  // the operator API); trainwatchd --metrics_stale_run_s. 0: never.
  int64_t stale_run_ms = 3'600'000;
  // The most recently seen runs exported beyond that; the others are
  // counted in trainwatch_metrics_runs_omitted. trainwatchd
  // --metrics_max_runs.
  size_t max_runs = 1000;
};

// What one scrape shows, read from the live state (ReadSources) and turned
// into families by MetricFamilies, one small function per group of them.
struct MetricsSources {
  std::optional<LeaseFigures> leases;  // a replica's (trainwatchd --replica)
  // Whether this trainwatchd takes records: a standby exports its leases
  // alone (the owner exports the runs; two replicas would double the sums).
  bool writer = false;
  std::vector<RunView> runs;  // the exported ones, in run id order
  size_t runs_omitted = 0;    // stale, or beyond max_runs
  IngestStats ingest;
  std::vector<StoreCounter> store_counters;
  int64_t streams_rejected = 0;
  int64_t pages_sent = 0;
  int64_t pages_failed = 0;
  std::map<std::string, std::set<int32_t>> connected;  // run -> ranks with a stream open
  int64_t now_ms = 0;
};

// Reads the runs' views and the service's own figures (`state`, its
// writer's) at scrape time. REQUIRES: `state` outlives the exporter.
// `leases`, for a replica (trainwatchd --replica): its shards and epoch, the
// only figures a standby exports; empty for a single trainwatchd.
MetricsSources ReadSources(ServiceState& state, const ExporterOptions& options,
                           const std::function<LeaseFigures()>& leases);
std::vector<prometheus::MetricFamily> MetricFamilies(const MetricsSources& sources);

// The Collectable /metrics serves: ReadSources then MetricFamilies at each
// scrape.
std::shared_ptr<prometheus::Collectable> NewExporter(
    ServiceState* state, ExporterOptions options = {},
    std::function<LeaseFigures()> leases = nullptr);

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_EXPORTER_H_
