#include "exporter/exporter.h"

#include <prometheus/client_metric.h>
#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>
#include <prometheus/metric_type.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "api/service_state.h"

namespace trainwatch::server {

namespace {

using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<prometheus::ClientMetric::Label>;

// The families of one scrape, in the order they are added. A deque: a
// family's reference stays valid while later ones are added (a vector's
// push_back would move the earlier ones away).
class FamilyList {
 public:
  MetricFamily& Add(const char* name, const char* help, MetricType type) {
    families_.push_back(MetricFamily{name, help, type, {}});
    return families_.back();
  }
  std::vector<MetricFamily> Take() {
    return {std::make_move_iterator(families_.begin()), std::make_move_iterator(families_.end())};
  }

 private:
  std::deque<MetricFamily> families_;
};

void Set(MetricFamily& f, Labels labels, double value) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  if (f.type == MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f.metric.push_back(std::move(m));
}

// Every replica exports these, a standby with 0 shards owned; the rules'
// TrainwatchShardsUnowned sums them over replicas.
void LeaseFamilies(const LeaseFigures& l, FamilyList& out) {
  // Every replica exports these, a standby with 0 shards owned; the
  // rules' TrainwatchShardsUnowned sums them over replicas.
  Set(out.Add("trainwatch_lease_shards_owned", "Shards this replica owns.", MetricType::Gauge), {},
      double(l.shards_owned));
  Set(out.Add("trainwatch_lease_shards_total", "Shards runs hash to (--shards).",
              MetricType::Gauge),
      {}, double(l.shards_total));
  Set(out.Add("trainwatch_lease_epoch", "The highest epoch this replica owns a shard at.",
              MetricType::Gauge),
      {}, double(l.epoch));
  Set(out.Add("trainwatch_lease_takeovers_total",
              "Shards this replica took over (each a failover to it, or its first start).",
              MetricType::Counter),
      {}, double(l.takeovers));
}

// The health metrics of each run's last evaluated step, its step and attempt.
void SignalFamilies(const MetricsSources& s, FamilyList& out) {
  struct Gauge {
    const char* name;
    const char* help;
    core::Signal signal;
  };
  const Gauge gauges[] = {
      {"trainwatch_loss", "Training loss of the last evaluated step, in nats.",
       core::Signal::kLoss},
      {"trainwatch_grad_norm", "Global L2 norm of the gradients before clipping.",
       core::Signal::kGradNorm},
      {"trainwatch_log_z", "Mean log partition function of the output softmax, in nats.",
       core::Signal::kLogZ},
      {"trainwatch_nan_frac", "Fraction of nonfinite gradient elements.", core::Signal::kNanFrac},
  };
  for (const Gauge& g : gauges) {
    MetricFamily& f = out.Add(g.name, g.help, MetricType::Gauge);
    for (const RunView& r : s.runs) {
      if (r.has_latest && r.latest.Has(g.signal)) {
        Set(f, {{"run", r.row.run_id}}, r.latest.Get(g.signal));
      }
    }
  }
  {
    // fp16 runs only: a bf16 or fp32 run has no loss scale and no series.
    MetricFamily& f =
        out.Add("trainwatch_loss_scale", "fp16 dynamic loss scale of the last evaluated step.",
                MetricType::Gauge);
    MetricFamily& o = out.Add("trainwatch_loss_scale_overflows_total",
                              "Steps on which the fp16 loss scaler found inf gradients and "
                              "skipped the update (tier 0, never a halt).",
                              MetricType::Counter);
    for (const RunView& r : s.runs) {
      if (r.has_latest && r.latest.HasLossScale()) {
        Set(f, {{"run", r.row.run_id}}, r.latest.loss_scale());
      }
      if (r.loss_scale_overflows_total > 0 || (r.has_latest && r.latest.HasLossScale())) {
        Set(o, {{"run", r.row.run_id}}, double(r.loss_scale_overflows_total));
      }
    }
  }
  {
    MetricFamily& f = out.Add("trainwatch_loss_ema_ratio",
                              "Loss over the EMA of the previous 1,000 steps.", MetricType::Gauge);
    for (const RunView& r : s.runs) {
      if (r.has_latest && !std::isnan(r.latest.loss_ema_ratio)) {
        Set(f, {{"run", r.row.run_id}}, r.latest.loss_ema_ratio);
      }
    }
  }
  {
    MetricFamily& f =
        out.Add("trainwatch_step", "Last evaluated step of the run.", MetricType::Gauge);
    for (const RunView& r : s.runs) Set(f, {{"run", r.row.run_id}}, double(r.row.last_step));
  }
  {
    MetricFamily& f =
        out.Add("trainwatch_run_attempt",
                "The run's attempt: 0 at the start, one more per rollback.", MetricType::Gauge);
    for (const RunView& r : s.runs) Set(f, {{"run", r.row.run_id}}, double(r.row.attempt));
  }
}

void IncidentFamilies(const MetricsSources& s, FamilyList& out) {
  {
    MetricFamily& f =
        out.Add("trainwatch_incidents_total",
                "Incidents opened, by run and tier (0: early warnings).", MetricType::Counter);
    MetricFamily& g =
        out.Add("trainwatch_incidents_open", "Incidents not yet resolved.", MetricType::Gauge);
    for (const RunView& r : s.runs) {
      for (int t = 0; t < 4; ++t) {
        Set(f, {{"run", r.row.run_id}, {"tier", std::to_string(t)}}, double(r.incidents_total[t]));
        Set(g, {{"run", r.row.run_id}, {"tier", std::to_string(t)}}, double(r.open_incidents[t]));
      }
    }
  }
}

// What was skipped, recommended, decided by agents, and where they differed.
void DecisionFamilies(const MetricsSources& s, FamilyList& out) {
  {
    MetricFamily& f =
        out.Add("trainwatch_skipped_steps_total", "Steps whose optimizer update the rules skipped.",
                MetricType::Counter);
    MetricFamily& m =
        out.Add("trainwatch_incomplete_steps_total",
                "Steps completed by timeout with ranks missing.", MetricType::Counter);
    // Followed runs only: what the rules would have skipped in a trainer
    // nothing can reach, apart from the skips taken above.
    MetricFamily& rec = out.Add("trainwatch_skips_recommended_total",
                                "Steps of a followed run (twctl follow: observed, not enforced) "
                                "whose update the rules would have skipped; not applied.",
                                MetricType::Counter);
    MetricFamily& obs = out.Add("trainwatch_run_observed",
                                "1 for a run followed from its log (twctl follow): observed, "
                                "not enforced; no update skipped, no halt.",
                                MetricType::Gauge);
    MetricFamily& a = out.Add("trainwatch_agent_decisions_total",
                              "Skips and halts agents decided, each on record as a decision, "
                              "since trainwatchd started.",
                              MetricType::Counter);
    MetricFamily& d = out.Add("trainwatch_decision_divergences_total",
                              "Evaluated steps where the agent's verdict differs from the "
                              "server engine's by the run's rules, since trainwatchd started.",
                              MetricType::Counter);
    for (const RunView& r : s.runs) {
      Set(f, {{"run", r.row.run_id}}, double(r.skipped_total));
      Set(m, {{"run", r.row.run_id}}, double(r.missing_rank_steps_total));
      Set(a, {{"run", r.row.run_id}}, double(r.agent_decisions_total));
      Set(d, {{"run", r.row.run_id}}, double(r.decision_divergences_total));
      if (r.row.observed) {
        Set(rec, {{"run", r.row.run_id}}, double(r.skips_recommended_total));
        Set(obs, {{"run", r.row.run_id}}, 1.0);
      }
    }
  }
}

void LivenessFamilies(const MetricsSources& s, FamilyList& out) {
  {
    // Liveness (docs/hangs.md), for the runs whose agents send heartbeats:
    // the Prometheus rules' backstop to trainwatchd's own stall pages, and
    // the dashboard's stall and straggler row.
    MetricFamily& since =
        out.Add("trainwatch_run_seconds_since_step", "Seconds since the run's last step was taken.",
                MetricType::Gauge);
    MetricFamily& bound = out.Add("trainwatch_run_stall_bound_seconds",
                                  "The run's stall bound now: learned from its step times, "
                                  "longer before they are and in checkpoints or evaluations.",
                                  MetricType::Gauge);
    MetricFamily& stalled =
        out.Add("trainwatch_run_stalled", "1 while the run is stalled (an open stall incident).",
                MetricType::Gauge);
    MetricFamily& lost =
        out.Add("trainwatch_run_ranks_lost", "Ranks whose heartbeats stopped while others' go on.",
                MetricType::Gauge);
    MetricFamily& step = out.Add("trainwatch_run_step_seconds",
                                 "The median of the ranks' recent step times.", MetricType::Gauge);
    MetricFamily& goodput = out.Add("trainwatch_run_goodput_ratio",
                                    "The run's net step progress at its median step time over "
                                    "the wall time since trainwatchd first saw it step: stalls "
                                    "and steps trained again after a rollback lower it.",
                                    MetricType::Gauge);
    MetricFamily& pace = out.Add("trainwatch_rank_step_time_ratio",
                                 "A rank's own time per step over the median rank's, for the "
                                 "run's slowest ranks only (at most 5 series per run).",
                                 MetricType::Gauge);
    const int64_t now = s.now_ms;
    for (const RunView& r : s.runs) {
      const LivenessView& l = r.liveness;
      if (l.ranks_alive == 0) continue;
      const std::vector<prometheus::ClientMetric::Label> run = {{"run", r.row.run_id}};
      Set(since, run, double(now - l.last_step_ms) / 1000.0);
      Set(bound, run, double(l.bound_ms) / 1000.0);
      Set(stalled, run, l.stalled ? 1.0 : 0.0);
      Set(lost, run, double(l.ranks_lost));
      Set(step, run, double(l.step_ms_median) / 1000.0);
      if (l.goodput >= 0) Set(goodput, run, l.goodput);
      for (const RankTiming& t : l.slowest) {
        Set(pace, {{"run", r.row.run_id}, {"rank", std::to_string(t.rank)}, {"host", t.host}},
            t.ratio);
      }
    }
  }
}

void AgentFamilies(const MetricsSources& s, FamilyList& out) {
  {
    const auto& connected = s.connected;
    MetricFamily& f =
        out.Add("trainwatch_agents_connected", "Agent streams open, by run.", MetricType::Gauge);
    for (const RunView& r : s.runs) {
      auto it = connected.find(r.row.run_id);
      Set(f, {{"run", r.row.run_id}}, it == connected.end() ? 0.0 : double(it->second.size()));
    }
  }
}

// trainwatchd's own: the run table, ingest, the store, streams and pages.
void ServerFamilies(const MetricsSources& s, FamilyList& out) {
  Set(out.Add("trainwatch_metrics_runs_omitted",
              "Runs left out of /metrics: seen too long ago, or beyond the most recent "
              "--metrics_max_runs.",
              MetricType::Gauge),
      {}, double(s.runs_omitted));
  const IngestStats& st = s.ingest;
  Set(out.Add("trainwatch_runs_in_memory", "Runs holding their rule engine's state in memory.",
              MetricType::Gauge),
      {}, double(st.runs_in_memory));
  Set(out.Add("trainwatch_runs_rebuilding",
              "Runs whose rule engine is still being rebuilt from the store after a restart "
              "(their figures are the stored ones meanwhile).",
              MetricType::Gauge),
      {}, double(st.runs_rebuilding));
  Set(out.Add("trainwatch_runs_evicted_total",
              "Idle runs evicted from memory (rebuilt from the store when they stream again).",
              MetricType::Counter),
      {}, double(st.runs_evicted_total));
  Set(out.Add("trainwatch_runs_rebuilt_total", "Evicted runs rebuilt from the store.",
              MetricType::Counter),
      {}, double(st.runs_rebuilt_total));
  Set(out.Add("trainwatch_command_acks_refused_total",
              "Command acknowledgements refused: another run's command, or none under way.",
              MetricType::Counter),
      {}, double(st.refused_acks_total));
  Set(out.Add("trainwatch_resumes_total",
              "New attempts opened by a restarted job resuming before its run's last step.",
              MetricType::Counter),
      {}, double(st.resumes_total));
  Set(out.Add("trainwatch_incarnation_conflicts_total",
              "Older incarnations of a run ended or refused because a newer one streams it.",
              MetricType::Counter),
      {}, double(st.incarnation_conflicts_total));
  Set(out.Add("trainwatch_ingest_far_steps_total",
              "Step reports too far ahead of their run: stored, not evaluated.",
              MetricType::Counter),
      {}, double(st.far_steps_total));
  Set(out.Add("trainwatch_ingest_records_total", "Step reports received.", MetricType::Counter), {},
      double(st.records_total));
  Set(out.Add("trainwatch_ingest_duplicates_total",
              "Step reports already stored (re-sent after a reconnect).", MetricType::Counter),
      {}, double(st.duplicates_total));
  Set(out.Add("trainwatch_ingest_queue_depth", "Messages waiting for the writer.",
              MetricType::Gauge),
      {}, double(st.queue_depth));
  Set(out.Add("trainwatch_ingest_lag_seconds",
              "From the receipt of the oldest message of the last batch to its commit.",
              MetricType::Gauge),
      {}, double(st.last_lag_ms) / 1000.0);
  Set(out.Add("trainwatch_store_commits_total", "Store transactions committed.",
              MetricType::Counter),
      {}, double(st.batches_total));
  Set(out.Add("trainwatch_store_commit_seconds_total", "Time spent committing batches.",
              MetricType::Counter),
      {}, st.commit_seconds_sum);
  Set(out.Add("trainwatch_store_last_commit_seconds", "Duration of the last commit.",
              MetricType::Gauge),
      {}, st.last_commit_seconds);
  Set(out.Add("trainwatch_store_errors_total", "Batches the store failed to write.",
              MetricType::Counter),
      {}, double(st.store_errors_total));
  // The backend's own counters (WAL checkpoints for SQLite, commits the
  // ack rule refused for PostgreSQL), read live from the store.
  for (const StoreCounter& c : s.store_counters) {
    Set(out.Add(c.name.c_str(), c.help.c_str(), MetricType::Counter), {}, double(c.value));
  }
  Set(out.Add("trainwatch_agent_streams_rejected_total",
              "Agent streams ended for a bad token or a malformed message.", MetricType::Counter),
      {}, double(s.streams_rejected));
  Set(out.Add("trainwatch_pages_sent_total", "Pages delivered.", MetricType::Counter), {},
      double(s.pages_sent));
  Set(out.Add("trainwatch_pages_failed_total", "Page delivery attempts that failed.",
              MetricType::Counter),
      {}, double(s.pages_failed));
}

// Drops the runs not to export (stale, or beyond the most recent max_runs),
// keeping the rest in run id order; returns how many went.
size_t KeepExported(const ExporterOptions& options, int64_t now, std::vector<RunView>* runs) {
  const size_t before = runs->size();
  if (options.stale_run_ms > 0) {
    const int64_t oldest = now - options.stale_run_ms;
    runs->erase(std::remove_if(runs->begin(), runs->end(),
                               [&](const RunView& r) { return r.row.last_seen_ms < oldest; }),
                runs->end());
  }
  if (runs->size() > options.max_runs) {
    std::vector<int64_t> seen;
    seen.reserve(runs->size());
    for (const RunView& r : *runs) seen.push_back(r.row.last_seen_ms);
    // The max_runs-th most recent time; ties at it broken by run id order.
    std::nth_element(seen.begin(), seen.begin() + (options.max_runs - 1), seen.end(),
                     std::greater<>());
    const int64_t cut = seen[options.max_runs - 1];
    size_t newer = 0;
    for (const RunView& r : *runs) newer += r.row.last_seen_ms > cut;
    size_t ties = options.max_runs - newer;
    runs->erase(std::remove_if(runs->begin(), runs->end(),
                               [&](const RunView& r) {
                                 if (r.row.last_seen_ms > cut) return false;
                                 if (r.row.last_seen_ms == cut && ties > 0) {
                                   --ties;
                                   return false;
                                 }
                                 return true;
                               }),
                runs->end());
  }
  return before - runs->size();
}

// Reads live state at scrape time: no shadow counters to keep in step.
class Exporter : public prometheus::Collectable {
 public:
  Exporter(ServiceState* state, ExporterOptions options, std::function<LeaseFigures()> leases)
      : state_(state), options_(options), leases_(std::move(leases)) {}

  std::vector<MetricFamily> Collect() const override {
    return MetricFamilies(ReadSources(*state_, options_, leases_));
  }

 private:
  ServiceState* state_;
  ExporterOptions options_;
  std::function<LeaseFigures()> leases_;
};

}  // namespace

MetricsSources ReadSources(ServiceState& state, const ExporterOptions& options,
                           const std::function<LeaseFigures()>& leases) {
  MetricsSources s;
  if (leases) s.leases = leases();
  s.now_ms = state.clock()->NowMs();
  Ingestor* const writer = state.writer();
  if (writer == nullptr) return s;
  s.writer = true;
  s.runs = writer->views().All();
  s.runs_omitted = KeepExported(options, s.now_ms, &s.runs);
  s.ingest = writer->Stats();
  s.store_counters = state.store()->Counters();
  s.streams_rejected = state.streams_rejected.load();
  s.pages_sent = state.pager()->sent_total();
  s.pages_failed = state.pager()->failed_total();
  s.connected = state.sessions().ConnectedRanks();
  return s;
}

std::vector<MetricFamily> MetricFamilies(const MetricsSources& s) {
  FamilyList out;
  if (s.leases) LeaseFamilies(*s.leases, out);
  // A standby exports its leases alone: the runs' series come from the
  // owner, and the same series from two replicas would double every sum.
  if (!s.writer) return out.Take();
  SignalFamilies(s, out);
  IncidentFamilies(s, out);
  DecisionFamilies(s, out);
  LivenessFamilies(s, out);
  AgentFamilies(s, out);
  ServerFamilies(s, out);
  return out.Take();
}

std::shared_ptr<prometheus::Collectable> NewExporter(ServiceState* state, ExporterOptions options,
                                                     std::function<LeaseFigures()> leases) {
  return std::make_shared<Exporter>(state, options, std::move(leases));
}

}  // namespace trainwatch::server
