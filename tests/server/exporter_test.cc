// The exporter (server/exporter/): MetricFamilies turns one scrape's
// MetricsSources into families, a standby's leases alone, an owner's runs
// and its own figures; no ServiceState needed to say what /metrics shows.

#include "exporter/exporter.h"

#include <prometheus/metric_family.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace trainwatch::server {
namespace {

const prometheus::MetricFamily* Find(const std::vector<prometheus::MetricFamily>& families,
                                     const std::string& name) {
  for (const prometheus::MetricFamily& f : families) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

MetricsSources Owner() {
  MetricsSources s;
  s.writer = true;
  s.now_ms = 100'000;
  RunView r;
  r.row.run_id = "run-a";
  r.row.last_step = 420;
  r.has_latest = true;
  r.latest.Set(core::Signal::kLoss, 2.5);
  r.latest.loss_ema_ratio = 1.01;
  r.incidents_total[2] = 1;
  r.liveness.ranks_alive = 4;
  r.liveness.last_step_ms = 97'500;
  r.liveness.slowest.push_back(RankTiming{3, "gpu-7", 1.6});
  s.runs.push_back(r);
  s.runs_omitted = 2;
  s.ingest.records_total = 1234;
  s.pages_sent = 5;
  s.connected["run-a"] = {0, 1, 2, 3};
  return s;
}

TEST_CASE("exporter: a standby exports its leases alone", "[server][exporter]") {
  MetricsSources s = Owner();
  s.writer = false;
  s.leases = LeaseFigures{2, 8, 17, 3};
  const std::vector<prometheus::MetricFamily> families = MetricFamilies(s);
  REQUIRE(families.size() == 4);
  REQUIRE(Find(families, "trainwatch_lease_epoch") != nullptr);
  CHECK(Find(families, "trainwatch_lease_epoch")->metric.at(0).gauge.value == 17);
  CHECK(Find(families, "trainwatch_lease_takeovers_total")->metric.at(0).counter.value == 3);
  CHECK(Find(families, "trainwatch_loss") == nullptr);
}

TEST_CASE("exporter: an owner's runs and its own figures - each family once",
          "[server][exporter]") {
  const std::vector<prometheus::MetricFamily> families = MetricFamilies(Owner());
  CHECK(Find(families, "trainwatch_lease_epoch") == nullptr);  // not a replica
  const prometheus::MetricFamily* loss = Find(families, "trainwatch_loss");
  REQUIRE(loss != nullptr);
  REQUIRE(loss->metric.size() == 1);
  CHECK(loss->metric[0].label.at(0).value == "run-a");
  CHECK(loss->metric[0].gauge.value == 2.5);
  CHECK(Find(families, "trainwatch_grad_norm")->metric.empty());  // not reported
  CHECK(Find(families, "trainwatch_step")->metric.at(0).gauge.value == 420);
  CHECK(Find(families, "trainwatch_incidents_total")->metric.size() == 4);  // a series per tier
  CHECK(Find(families, "trainwatch_run_seconds_since_step")->metric.at(0).gauge.value == 2.5);
  const prometheus::MetricFamily* pace = Find(families, "trainwatch_rank_step_time_ratio");
  REQUIRE(pace->metric.size() == 1);
  CHECK(pace->metric[0].label.at(2).value == "gpu-7");
  CHECK(Find(families, "trainwatch_agents_connected")->metric.at(0).gauge.value == 4);
  CHECK(Find(families, "trainwatch_metrics_runs_omitted")->metric.at(0).gauge.value == 2);
  CHECK(Find(families, "trainwatch_ingest_records_total")->metric.at(0).counter.value == 1234);
  CHECK(Find(families, "trainwatch_pages_sent_total")->metric.at(0).counter.value == 5);
  for (size_t i = 0; i < families.size(); ++i) {
    for (size_t j = i + 1; j < families.size(); ++j) CHECK(families[i].name != families[j].name);
  }
}

}  // namespace
}  // namespace trainwatch::server
