// incidents, incident show, watch: what fired, why, and as it happens.

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "command_output.h"
#include "commands.h"
#include "operator_client.h"
#include "proto_text.h"

namespace trainwatch::cli {
namespace {

// The most runs of consecutive ids `incident show` writes out.
constexpr int kShownIdRuns = 8;

// Suspect shard ids as runs of consecutive ids, with their count:
// "7, 19..21, 30 (5 shards)". The bounding range alone ("7..30") would read
// as 24 shards.
std::string ShardIdRuns(const google::protobuf::RepeatedField<uint64_t>& ids) {
  std::vector<uint64_t> v(ids.begin(), ids.end());
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  std::vector<std::string> runs;
  int total_runs = 0;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    if (++total_runs <= kShownIdRuns) {
      runs.push_back(i == j ? absl::StrCat(v[i]) : absl::StrCat(v[i], "..", v[j]));
    }
    i = j + 1;
  }
  std::string out = absl::StrJoin(runs, ", ");
  if (total_runs > kShownIdRuns) {
    absl::StrAppend(&out, ", ... (", total_runs - kShownIdRuns, " runs more; --output json lists "
                    "them)");
  }
  absl::StrAppend(&out, " (", v.size(), v.size() == 1 ? " shard)" : " shards)");
  return out;
}

class IncidentsCommand : public Command {
 public:
  IncidentsCommand()
      : Command(CommandSpec("incidents", "", "incidents, newest last",
                            {{"open", "", "only those not yet resolved or dismissed"},
                             {"run", "RUN", "only this run's"}})
                    .Connecting()) {}

  int Execute(const Args& args, Context& ctx) const override {
    v1::ListIncidentsRequest req;
    req.set_open_only(args.Has("open"));
    if (args.Has("run")) req.set_run_id(args.Get("run"));
    req.set_page_size(1000);
    v1::ListIncidentsResponse resp;
    if (int rc = FromStatus(ctx.client->ListIncidents(req, &resp), ctx.err); rc != kOk) return rc;
    if (args.output == "json") {
      *ctx.out = Json(resp);
      return kOk;
    }
    *ctx.out = absl::StrFormat("%-7s %-16s %-4s %-18s %8s %9s  %s\n", "ID", "RUN", "TIER", "STATE",
                               "ONSET", "DETECTED", "TITLE");
    for (const auto& i : resp.incidents()) {
      absl::StrAppendFormat(ctx.out, "%-7s %-16s %-4s %-18s %8d %9d  %s\n", i.incident_id(),
                            i.run_id(), TierName(i.tier()), StateName(i.state()), i.onset_step(),
                            i.detection_step(), RowTitle(IncidentTitle(i)));
    }
    return kOk;
  }
};

class IncidentShowCommand : public Command {
 public:
  IncidentShowCommand()
      : Command(CommandSpec("incident show", "ID",
                            "the diagnostic summary, with terminal charts, and the decisions taken",
                            {})
                    .Connecting()) {}

  int Execute(const Args& args, Context& ctx) const override {
    v1::GetIncidentRequest req;
    req.set_incident_id(args.operands[0]);
    v1::GetIncidentResponse resp;
    if (int rc = FromStatus(ctx.client->GetIncident(req, &resp), ctx.err); rc != kOk) return rc;
    if (args.output == "json") {
      *ctx.out = Json(resp);
      return kOk;
    }
    // The run's warm-up, as twctl status says it: whether the baseline rules
    // could decide when this was detected. Best effort: the incident is
    // shown without it if the run cannot be read.
    v1::GetRunStatusRequest run_req;
    run_req.set_run_id(resp.incident().run_id());
    run_req.set_window_steps(1);
    v1::GetRunStatusResponse run;
    const bool run_read = ctx.client->GetRunStatus(run_req, &run).ok();
    *ctx.out = Summary(resp.incident(), run_read && run.run().has_warm_up()
                                            ? &run.run().warm_up()
                                            : nullptr);
    return kOk;
  }

 private:
  static std::string Summary(const v1::Incident& i, const v1::RunWarmUp* warm_up) {
    const v1::DiagnosticSummary& s = i.summary();
    std::string out =
        absl::StrFormat("%s  run %s  tier %s  %s%s\nonset step %d, detected at step %d\n",
                        i.incident_id(), i.run_id(), TierName(i.tier()), StateName(i.state()),
                        i.observed() ? absl::StrCat("  (", kObservedText, ")") : "",
                        s.onset_step(), s.detection_step());
    if (warm_up != nullptr && s.detection_step() < warm_up->until_step()) {
      absl::StrAppendFormat(&out,
                            "detected in the run's warm-up (until step %d): no update was skipped "
                            "and the baseline rules did not page; a bad batch is recorded, a "
                            "divergence pages, a NaN halts (docs/rules.md#warm-up)\n",
                            warm_up->until_step());
    }
    absl::StrAppend(&out, "\n", s.explanation(), "\n\n");
    std::vector<std::pair<int64_t, double>> lz, loss;
    for (const auto& p : s.log_z_trend()) lz.emplace_back(p.step(), p.value());
    for (const auto& p : s.loss_around_onset()) loss.emplace_back(p.step(), p.value());
    if (!lz.empty()) out += Chart("log_z over the 5,000 steps before the onset", lz) + "\n";
    if (!loss.empty()) out += Chart("loss around the onset", loss) + "\n";
    if (s.grad_norm_percentiles_size() > 0) {
      out += "grad_norm percentiles before the onset\n";
      absl::StrAppendFormat(&out, "  %-17s %9s %9s %9s %9s %7s\n", "steps", "p50", "p90", "p99",
                            "max", "n");
      for (const auto& w : s.grad_norm_percentiles()) {
        absl::StrAppendFormat(&out, "  %8d..%-8d %9s %9s %9s %9s %7d\n", w.first_step(),
                              w.last_step(), Fmt(w.p50()), Fmt(w.p90()), Fmt(w.p99()), Fmt(w.max()),
                              w.sample_count());
      }
      out += "\n";
    }
    if (s.tensor_breakdown_size() > 0) {
      // Which tensors held the nonfinite values, on which ranks: where to look.
      out += "nonfinite gradients by tensor\n";
      absl::StrAppendFormat(&out, "  %-40s %12s %14s  %s\n", "tensor", "nonfinite", "elements",
                            "ranks");
      for (const auto& t : s.tensor_breakdown()) {
        absl::StrAppendFormat(&out, "  %-40s %12d %14d  %s\n", t.name(), t.nonfinite_count(),
                              t.element_count(), absl::StrJoin(t.ranks(), ","));
      }
      out += "\n";
    }
    if (s.suspect_shards().shard_ids_size() > 0) {
      absl::StrAppend(&out, "shards onset..detection: ", ShardIdRuns(s.suspect_shards().shard_ids()),
                      "\n");
    }
    if (s.suspect_shards().names_size() > 0) {
      absl::StrAppendFormat(&out, "named shards onset..detection: %s\n",
                            absl::StrJoin(s.suspect_shards().names(), ", "));
    }
    if (s.has_recommended_checkpoint()) {
      absl::StrAppendFormat(&out, "recommended checkpoint: step %d %s\n",
                            s.recommended_checkpoint().step(), s.recommended_checkpoint().uri());
    }
    for (const auto& a : s.recommended_actions()) {
      absl::StrAppendFormat(&out, "recommended: %s\n", a.description());
    }
    for (const auto& d : i.decisions()) {
      if (d.kind() == v1::DECISION_KIND_RESTARTED_UNDECIDED) {
        absl::StrAppendFormat(&out, "note %s: %s\n", d.decision_id(), d.comment());
        continue;
      }
      if (d.actor().kind() != v1::ACTOR_KIND_HUMAN) {
        absl::StrAppendFormat(&out, "decision %s: taken by %s on every rank\n", d.decision_id(),
                              d.actor().id());
        continue;
      }
      absl::StrAppendFormat(
          &out, "decision %s: %s by %s: \"%s\"\n", d.decision_id(),
          d.kind() == v1::DECISION_KIND_APPROVE_ROLLBACK ? "approved" : "rejected", d.actor().id(),
          d.comment());
      if (d.plan().has_cost()) {  // the rollback's price in GPU time
        absl::StrAppendFormat(&out, "  rollback to step %d %s\n", d.plan().target_step(),
                              CostText(d.plan().cost()));
      }
    }
    if (!s.approve_command().empty()) {
      absl::StrAppendFormat(&out, "\napprove with:\n  %s\n", s.approve_command());
    } else if (!s.no_rollback().empty()) {
      absl::StrAppendFormat(&out, "\n%s\n", s.no_rollback());
    }
    return out;
  }
};

// watch's bounds: a zero or negative --count or --timeout is a usage error,
// as is a timeout past a year (a deadline that far overflows the clock's
// arithmetic).
constexpr int64_t kMaxCount = 1'000'000'000;
constexpr int64_t kMaxTimeoutS = 365 * 24 * 3600;

// Incident changes as they happen, a line each (a JSON object a line with
// -o json), until Ctrl-C, --count events or --timeout seconds.
class WatchCommand : public Command {
 public:
  WatchCommand()
      : Command(CommandSpec("watch", "", "incident changes as they happen (Ctrl-C ends)",
                            {{"run", "RUN", "only this run's"},
                             {"open", "", "first a snapshot of each open incident"},
                             {"count", "N", "end after N events (1 to 10^9)"},
                             {"timeout", "S", "end after S seconds (1 to 31536000, a year)"}})
                    .Connecting()) {}

  int Execute(const Args& args, Context& ctx) const override {
    // 0: no limit, when the flag is not given.
    const absl::StatusOr<int64_t> count = args.GetInt("count", 0, 1, kMaxCount);
    const absl::StatusOr<int64_t> timeout_s = args.GetInt("timeout", 0, 1, kMaxTimeoutS);
    for (const absl::Status& s : {count.status(), timeout_s.status()}) {
      if (!s.ok()) {
        *ctx.err = absl::StrCat("twctl watch: ", s.message(), "\n");
        return kUsage;
      }
    }
    v1::WatchIncidentsRequest req;
    if (args.Has("run")) req.set_run_id(args.Get("run"));
    req.set_include_open(args.Has("open"));
    const bool json = args.output == "json";
    if (!json) ctx.Stream(Row("TIME", "EVENT", "ID", "RUN", "TIER", "STATE", "TITLE"));
    int64_t seen = 0;
    bool enough = false;
    const grpc::Status st =
        ctx.client->WatchIncidents(req, *timeout_s, [&](const v1::IncidentEvent& ev) {
          if (json) {
            ctx.Stream(Json(ev));
          } else {
            std::string kind = v1::IncidentEventKind_Name(ev.kind());
            kind = absl::AsciiStrToLower(kind.substr(std::string("INCIDENT_EVENT_KIND_").size()));
            const v1::Incident& i = ev.incident();
            ctx.Stream(Row(UtcTime(ev.time().seconds()), kind, i.incident_id(), i.run_id(),
                           TierName(i.tier()), StateName(i.state()), RowTitle(IncidentTitle(i))));
          }
          enough = *count > 0 && ++seen >= *count;
          return !enough;
        });
    if (enough || st.error_code() == grpc::DEADLINE_EXCEEDED) return kOk;
    return FromStatus(st, ctx.err);
  }

 private:
  static std::string Row(const std::string& time, const std::string& event, const std::string& id,
                         const std::string& run, const std::string& tier, const std::string& state,
                         const std::string& title) {
    return absl::StrFormat("%-20s %-13s %-7s %-16s %-4s %-18s %s\n", time, event, id, run, tier,
                           state, title);
  }
};

}  // namespace

std::unique_ptr<Command> MakeIncidentsCommand() { return std::make_unique<IncidentsCommand>(); }
std::unique_ptr<Command> MakeIncidentShowCommand() {
  return std::make_unique<IncidentShowCommand>();
}
std::unique_ptr<Command> MakeWatchCommand() { return std::make_unique<WatchCommand>(); }

}  // namespace trainwatch::cli
