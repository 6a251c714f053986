// runs, status, shards, report: what a run looks like now.

#include <algorithm>
#include <cmath>
#include <fstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "command_output.h"
#include "commands.h"
#include "operator_client.h"
#include "proto_text.h"
#include "report.h"
#include "trainwatch/core/config.h"
#include "trainwatch/core/shard_names.h"
#include "trainwatch/wire/time.h"

namespace trainwatch::cli {
namespace {

// The most steps the server answers a status with (its own cap).
constexpr int64_t kMaxPoints = 100'000;

// What the heartbeats say: the time since the last step against the stall
// bound, lost ranks, and the slowest ranks' pace (docs/hangs.md).
std::string LivenessText(const v1::RunLiveness& l) {
  std::string out = absl::StrFormat(
      "  liveness: %s; last step %.1f s ago (stall bound %.0f s), median step %.3f s, %d ranks "
      "heard from",
      l.stalled() ? "STALLED" : "stepping", l.seconds_since_step(), l.stall_bound_seconds(),
      l.step_seconds(), l.ranks_alive());
  if (l.ranks_lost() > 0) absl::StrAppendFormat(&out, ", %d LOST", l.ranks_lost());
  if (l.goodput() >= 0) absl::StrAppendFormat(&out, ", goodput %.0f%%", 100 * l.goodput());
  absl::StrAppend(&out, "\n");
  if (l.slowest_size() > 0) {
    absl::StrAppend(&out, "  slowest ranks:");
    for (const v1::RankPace& p : l.slowest()) {
      absl::StrAppendFormat(&out, " %d%s %.2fx", p.rank(),
                            p.host_name().empty() ? "" : absl::StrCat(" (", p.host_name(), ")"),
                            p.ratio());
      if (&p != &l.slowest(l.slowest_size() - 1)) absl::StrAppend(&out, ",");
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

// Where the run stands in its warm-up (docs/rules.md#warm-up), by the rules
// it is judged by.
std::string WarmUpText(const v1::RunInfo& run) {
  const v1::RunWarmUp& w = run.warm_up();
  if (!w.active()) return "  warm-up: over; every rule decides\n";
  absl::StatusOr<core::RuleConfig> rules =
      run.rules_json().empty() ? core::RuleConfig() : core::ParseRuleConfigJson(run.rules_json(), "rules");
  const core::RuleConfig r = rules.ok() ? *rules : core::RuleConfig();
  // The records it still waits for, if any: the step alone is the usual end.
  std::vector<std::string> waits;
  if (w.loss_records() < r.warmup_min_records) {
    waits.push_back(absl::StrFormat("%d of %d loss records", w.loss_records(),
                                    r.warmup_min_records));
  }
  if (w.needs_grad() && w.grad_samples() < r.warmup_min_grad_samples) {
    waits.push_back(absl::StrFormat("%d of %d grad-norm samples", w.grad_samples(),
                                    r.warmup_min_grad_samples));
  }
  return absl::StrFormat(
      "  warm-up: until step %d%s: no update is skipped and the baseline rules do not page "
      "until then; a bad batch is recorded, a loss %gx its lowest value for %d records pages, a "
      "NaN halts\n",
      w.until_step(),
      waits.empty() ? "" : absl::StrCat(" and ", absl::StrJoin(waits, ", "), " so far"),
      r.warmup_divergence_ratio, r.warmup_divergence_records);
}

// A standby replica's answer (operator.proto, StandbyAnswer) says so: its
// figures lag the owner's, and agent connections are the owner's to know.
std::string StandbyNote(const v1::StandbyAnswer& s) {
  const std::string owner =
      s.owner().empty() ? std::string("the owner (none at the moment: a takeover is due)")
                        : absl::StrCat("the owner, replica ", s.owner());
  if (!s.has_as_of()) {
    return absl::StrFormat(
        "  answered by standby replica %s while it first reads the store (runs may be missing); "
        "agent connections are known to %s\n",
        s.replica(), owner);
  }
  const double age_s =
      static_cast<double>(absl::ToUnixMillis(absl::Now()) - wire::TimeFromProto(s.as_of())) / 1e3;
  return absl::StrFormat(
      "  answered by standby replica %s from the store as of %.1f s ago; agent connections are "
      "known to %s\n",
      s.replica(), std::max(0.0, age_s), owner);
}

class RunsCommand : public Command {
 public:
  RunsCommand()
      : Command(CommandSpec("runs", "", "the runs and their state", {})
                    .Connecting()
                    .WithNotes("states:\n"
                               "  running       an agent of the run is connected\n"
                               "  halted        its last evaluated step was halted\n"
                               "  finished      every rank's agent closed: the trainer ended, or a\n"
                               "                followed log's writer exited\n"
                               "  stale         its agents went silent without closing (killed,\n"
                               "                host or network lost), or trainwatchd restarted\n"
                               "                since it ended\n")) {}

  int Execute(const Args& args, Context& ctx) const override {
    v1::ListRunsResponse resp;
    if (int rc = FromStatus(ctx.client->ListRuns({}, &resp), ctx.err); rc != kOk) return rc;
    if (args.output == "json") {
      *ctx.out = Json(resp);
      return kOk;
    }
    *ctx.out = absl::StrFormat("%-24s %-9s %6s %10s %6s %6s\n", "RUN", "STATE", "WORLD", "STEP",
                               "RANKS", "OPEN");
    for (const auto& r : resp.runs()) {
      const std::string state = v1::RunState_Name(r.state()).substr(10);  // RUN_STATE_
      // A followed run, or one whose engine is still being rebuilt after a
      // restart, says so after its numbers; the columns stay as they are.
      absl::StrAppendFormat(ctx.out, "%-24s %-9s %6d %10d %6d %6d%s%s\n", r.run_id(),
                            absl::AsciiStrToLower(state), r.world_size(), r.latest_step(),
                            r.ranks_connected(), r.open_incidents(),
                            r.observed() ? absl::StrCat("  ", kObservedText) : "",
                            r.rebuilding() ? "  rebuilding" : "");
    }
    if (resp.has_standby()) absl::StrAppend(ctx.out, StandbyNote(resp.standby()));
    return kOk;
  }
};

class StatusCommand : public Command {
 public:
  StatusCommand()
      : Command(
            CommandSpec("status", "RUN",
                        "latest metrics, a sparkline each, the latest checkpoint, open incidents",
                        {{"points", "N", "steps the sparklines cover, 1 to 100000 (default 200)"}})
                .Connecting()
                .WithMisuse("twctl status: RUN is required\n")) {}

  int Execute(const Args& args, Context& ctx) const override {
    v1::GetRunStatusRequest req;
    req.set_run_id(args.operands[0]);
    absl::StatusOr<int64_t> points = args.GetInt("points", 200, 1, kMaxPoints);
    if (!points.ok()) {
      *ctx.err = absl::StrCat("twctl status: ", points.status().message(), "\n");
      return kUsage;
    }
    req.set_window_steps(static_cast<int32_t>(*points));
    v1::GetRunStatusResponse resp;
    if (int rc = FromStatus(ctx.client->GetRunStatus(req, &resp), ctx.err); rc != kOk) return rc;
    if (args.output == "json") {
      *ctx.out = Json(resp);
      return kOk;
    }
    std::string* out = ctx.out;
    const auto& m = resp.latest().metrics();
    // A standby knows no agent streams: it says so instead.
    const std::string ranks =
        resp.has_standby() ? absl::StrFormat("%d ranks", resp.run().world_size())
                           : absl::StrFormat("%d of %d ranks connected",
                                             resp.run().ranks_connected(), resp.run().world_size());
    *out = absl::StrFormat("run %s: step %d, %s, %d open incidents\n", resp.run().run_id(),
                           resp.run().latest_step(), ranks, resp.run().open_incidents());
    if (resp.has_standby()) absl::StrAppend(out, StandbyNote(resp.standby()));
    if (resp.run().observed()) {
      absl::StrAppend(out, "  followed from its log (twctl follow): ", kObservedText,
                      "; no update is skipped nor the trainer halted, a rollback is a restart "
                      "by hand\n");
    }
    if (resp.run().rebuilding()) {
      absl::StrAppend(out,
                      "  rebuilding: trainwatchd restarted and is replaying this run's stored "
                      "steps into its rule engine; the figures are the stored ones until then\n");
    }
    if (!resp.run().attachment().empty()) {  // what `trainwatch run` found
      absl::StrAppend(out, "  trainwatch run: ", resp.run().attachment(), "\n");
    }
    if (resp.run().has_liveness()) absl::StrAppend(out, LivenessText(resp.run().liveness()));
    absl::StrAppend(out, "  ", RulesText(resp.run()), "\n");
    if (resp.run().has_warm_up()) absl::StrAppend(out, WarmUpText(resp.run()));
    std::vector<double> loss, gn, lz, ratio;
    for (const auto& p : resp.recent()) {
      loss.push_back(p.metrics().has_loss() ? p.metrics().loss() : NAN);
      gn.push_back(p.metrics().has_grad_norm() ? p.metrics().grad_norm() : NAN);
      lz.push_back(p.metrics().has_log_z() ? p.metrics().log_z() : NAN);
      ratio.push_back(p.metrics().has_loss_ema_ratio() ? p.metrics().loss_ema_ratio() : NAN);
    }
    auto line = [&](const char* name, bool has, double v, const std::vector<double>& series) {
      absl::StrAppendFormat(out, "  %-15s %10s  %s\n", name, has ? Fmt(v) : "-", Sparkline(series));
    };
    line("loss", m.has_loss(), m.loss(), loss);
    line("grad_norm", m.has_grad_norm(), m.grad_norm(), gn);
    line("log_z", m.has_log_z(), m.log_z(), lz);
    line("loss_ema_ratio", m.has_loss_ema_ratio(), m.loss_ema_ratio(), ratio);
    line("nan_frac", m.has_nan_frac(), m.nan_frac(), {});
    if (resp.has_latest_checkpoint()) {
      absl::StrAppendFormat(out, "  latest checkpoint: step %d %s\n",
                            resp.latest_checkpoint().step(), resp.latest_checkpoint().uri());
    }
    for (const auto& i : resp.open_incidents()) {
      absl::StrAppendFormat(out, "  open: %s tier %s %s  %s\n", i.incident_id(), TierName(i.tier()),
                            StateName(i.state()), IncidentTitle(i));
    }
    // Only a run that was rolled back or resumed has more than one.
    if (resp.attempts_size() > 1) {
      for (const auto& a : resp.attempts()) {
        absl::StrAppendFormat(out, "  attempt %d%s: %s\n", a.attempt(),
                              a.attempt() == resp.run().attempt() ? " (current)" : "",
                              AttemptText(a));
      }
    }
    return kOk;
  }
};

class ShardsCommand : public Command {
 public:
  ShardsCommand()
      : Command(CommandSpec("shards", "RUN", "the run's quarantined shards: id ranges and names", {})
                    .Connecting()
                    .WithMisuse("twctl shards: RUN is required\n")) {}

  int Execute(const Args& args, Context& ctx) const override {
    v1::ListQuarantinedShardsRequest req;
    req.set_run_id(args.operands[0]);
    v1::ListQuarantinedShardsResponse resp;
    if (int rc = FromStatus(ctx.client->ListQuarantinedShards(req, &resp), ctx.err); rc != kOk) {
      return rc;
    }
    if (args.output == "json") {
      *ctx.out = Json(resp);
      return kOk;
    }
    *ctx.out = absl::StrFormat("%-24s %-8s %-8s %s\n", "SHARDS", "INCIDENT", "DECISION", "SINCE");
    for (const auto& e : resp.entries()) {
      // An entry is an id range or a name; a name is written as
      // --quarantine-shards would take it, so it can be pasted back.
      const std::string shards =
          e.shards().ranges_size() > 0
              ? absl::StrCat(e.shards().ranges(0).first(), "..", e.shards().ranges(0).last())
              : core::ShardListEntry(e.shards().names_size() > 0 ? e.shards().names(0) : "");
      absl::StrAppendFormat(ctx.out, "%-24s %-8s %-8s %s\n", shards, e.incident_id(),
                            e.decision_id(), UtcTime(e.added_at().seconds()));
    }
    if (resp.entries_size() == 0) *ctx.out += "(none quarantined)\n";
    return kOk;
  }
};

class ReportCommand : public Command {
 public:
  ReportCommand()
      : Command(
            CommandSpec("report", "RUN",
                        "the run as one HTML page: the metrics as charts, incidents, shards",
                        {{"out", "FILE", "where to write it (default trainwatch-report-RUN.html)"}})
                .Connecting()) {}

  int Execute(const Args& args, Context& ctx) const override {
    const std::string& run = args.operands[0];
    const std::string path = args.Get("out", absl::StrCat("trainwatch-report-", run, ".html"));
    // The current attempt (attempt < 0), or an abandoned one.
    auto history = [&](int64_t attempt, v1::GetRunStatusResponse* resp) {
      v1::GetRunStatusRequest req;
      req.set_run_id(run);
      req.set_window_steps(100000);  // the server's most; longer runs show their last 100k
      req.set_max_points(20000);
      if (attempt >= 0) req.set_attempt(attempt);
      return FromStatus(ctx.client->GetRunStatus(req, resp), ctx.err);
    };
    v1::GetRunStatusResponse status;
    if (int rc = history(-1, &status); rc != kOk) return rc;
    std::vector<v1::GetRunStatusResponse> earlier(static_cast<size_t>(status.run().attempt()));
    for (size_t a = 0; a < earlier.size(); ++a) {
      if (int rc = history(static_cast<int64_t>(a), &earlier[a]); rc != kOk) return rc;
    }
    v1::ListIncidentsResponse incidents;
    for (std::string token;;) {
      v1::ListIncidentsRequest req;
      req.set_run_id(run);
      req.set_page_size(1000);
      req.set_page_token(token);
      v1::ListIncidentsResponse chunk;
      if (int rc = FromStatus(ctx.client->ListIncidents(req, &chunk), ctx.err); rc != kOk) {
        return rc;
      }
      for (auto& i : *chunk.mutable_incidents()) *incidents.add_incidents() = std::move(i);
      token = chunk.next_page_token();
      if (token.empty()) break;
    }
    v1::ListQuarantinedShardsRequest shards_req;
    shards_req.set_run_id(run);
    v1::ListQuarantinedShardsResponse shards;
    if (int rc = FromStatus(ctx.client->ListQuarantinedShards(shards_req, &shards), ctx.err);
        rc != kOk) {
      return rc;
    }
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << RenderReportHtml(status, earlier, incidents, shards);
    f.close();
    if (!f) {
      *ctx.err = absl::StrCat("twctl report: cannot write ", path, "\n");
      return kError;
    }
    *ctx.out =
        absl::StrFormat("wrote %s: %d steps charted, %d incidents, %d quarantined ranges\n", path,
                        status.recent_size(), incidents.incidents_size(), shards.entries_size());
    return kOk;
  }
};

}  // namespace

std::unique_ptr<Command> MakeRunsCommand() { return std::make_unique<RunsCommand>(); }
std::unique_ptr<Command> MakeStatusCommand() { return std::make_unique<StatusCommand>(); }
std::unique_ptr<Command> MakeShardsCommand() { return std::make_unique<ShardsCommand>(); }
std::unique_ptr<Command> MakeReportCommand() { return std::make_unique<ReportCommand>(); }

}  // namespace trainwatch::cli
