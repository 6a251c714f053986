#include "trainwatch/cli/operator_commands.h"

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "proto_text.h"
#include "report.h"
#include "trainwatch/core/json.h"
#include "trainwatch/v1/operator.grpc.pb.h"

namespace trainwatch::cli {

namespace v1 = trainwatch::v1;

namespace {

constexpr int kOk = 0, kError = 1, kUsage = 2, kRefused = 3;

constexpr char kUsageText[] =
    "usage: twctl [--server ADDR] [--token TOKEN] [--ca-file PEM] [-o table|json] COMMAND ...\n"
    "  runs\n"
    "  status RUN [--points N]\n"
    "  incidents [--open] [--run RUN]\n"
    "  incident show ID\n"
    "  rollback approve ID [--to-step N] [--quarantine-shards A..B[,C..D]] [--z-loss-alpha X]\n"
    "                      [--skip-steps A..B|none]\n"
    "                      [--comment TEXT] [--yes] [--dry-run]\n"
    "  rollback reject ID --comment TEXT\n"
    "  shards RUN\n"
    "  report RUN [--out FILE]   one HTML page: the metrics as charts, incidents, shards\n"
    "  watch [--run RUN] [--open] [--count N] [--timeout S]   incident changes as they happen\n"
    "  replay FILE ...  (see twctl replay --help)\n"
    "Server and token: flags, else TRAINWATCH_SERVER / TRAINWATCH_TOKEN, else $TWCTL_CONFIG or\n"
    "~/.config/trainwatch/twctl.json ({\"server\": ..., \"token\": ..., \"ca_file\": ...}).\n"
    "Exit codes: 0 ok, 1 error, 2 usage, 3 refused by the server's state.\n";

struct Options {
  std::string server, token, ca_file, output = "table";
  std::vector<std::string> positional;
  std::map<std::string, std::string> flags;  // --name value (or "" for switches)
};

// Flags that take no value.
bool IsSwitch(const std::string& name) {
  return name == "open" || name == "yes" || name == "dry-run";
}

std::string TierName(v1::Tier t) { return std::to_string(TierNumber(t)); }

std::string Json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.always_print_primitive_fields = true;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out + "\n";
}

int FromStatus(const grpc::Status& s, std::string* err) {
  if (s.ok()) return kOk;
  *err += absl::StrCat("twctl: ", s.error_message(), " (", s.error_code(), ")\n");
  if (s.error_code() == grpc::FAILED_PRECONDITION) return kRefused;
  if (s.error_code() == grpc::INVALID_ARGUMENT) return kUsage;
  return kError;
}

std::string Fmt(double v) {
  if (std::isnan(v)) return "nan";
  return absl::StrFormat("%.4g", v);
}

}  // namespace

std::string Sparkline(const std::vector<double>& values, size_t width) {
  static const char* const kBlocks[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  if (values.empty()) return "";
  // Average into `width` columns.
  const size_t n = std::min(width, values.size());
  std::vector<double> cols(n, 0.0);
  std::vector<int> counts(n, 0);
  for (size_t i = 0; i < values.size(); ++i) {
    const size_t c = i * n / values.size();
    if (std::isfinite(values[i])) {
      cols[c] += values[i];
      ++counts[c];
    }
  }
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (size_t c = 0; c < n; ++c) {
    if (counts[c] == 0) continue;
    cols[c] /= counts[c];
    lo = std::min(lo, cols[c]);
    hi = std::max(hi, cols[c]);
  }
  std::string out;
  for (size_t c = 0; c < n; ++c) {
    if (counts[c] == 0) {
      out += " ";
      continue;
    }
    const int level = hi > lo ? static_cast<int>(std::lround((cols[c] - lo) / (hi - lo) * 7)) : 3;
    out += kBlocks[std::clamp(level, 0, 7)];
  }
  return out;
}

std::string Chart(const std::string& title, const std::vector<std::pair<int64_t, double>>& points,
                  size_t width, size_t height) {
  std::vector<std::pair<int64_t, double>> pts;
  for (const auto& p : points) {
    if (std::isfinite(p.second)) pts.push_back(p);
  }
  if (pts.empty()) return absl::StrCat(title, ": no data\n");
  double lo = pts[0].second, hi = lo;
  for (const auto& p : pts) {
    lo = std::min(lo, p.second);
    hi = std::max(hi, p.second);
  }
  if (hi == lo) hi = lo + 1e-9;
  const int64_t x0 = pts.front().first, x1 = std::max(pts.back().first, x0 + 1);
  std::vector<std::string> grid(height, std::string(width, ' '));
  for (const auto& [x, y] : pts) {
    const size_t col = static_cast<size_t>((x - x0) * static_cast<int64_t>(width - 1) / (x1 - x0));
    const size_t row = static_cast<size_t>(std::lround((hi - y) / (hi - lo) * (height - 1)));
    grid[std::min(row, height - 1)][std::min(col, width - 1)] = '*';
  }
  std::string out = absl::StrCat(title, "\n");
  for (size_t r = 0; r < height; ++r) {
    const double label = hi - (hi - lo) * static_cast<double>(r) / static_cast<double>(height - 1);
    absl::StrAppendFormat(&out, "%10s |%s\n", Fmt(label), grid[r]);
  }
  absl::StrAppendFormat(&out, "%10s +%s\n%11s %-*d%d\n", "", std::string(width, '-'), "",
                        static_cast<int>(width - 8), x0, x1);
  return out;
}

namespace {

class Client {
 public:
  Client(const Options& o) : token_(o.token) {
    std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
    if (!o.ca_file.empty()) {
      grpc::SslCredentialsOptions ssl;
      std::ifstream in(o.ca_file);
      ssl.pem_root_certs.assign(std::istreambuf_iterator<char>(in),
                                std::istreambuf_iterator<char>());
      creds = grpc::SslCredentials(ssl);
    }
    stub_ = v1::OperatorService::NewStub(grpc::CreateChannel(o.server, creds));
  }
  void Prepare(grpc::ClientContext* c) const {
    if (!token_.empty()) c->AddMetadata("authorization", "Bearer " + token_);
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  }
  v1::OperatorService::Stub* stub() { return stub_.get(); }

 private:
  std::string token_;
  std::unique_ptr<v1::OperatorService::Stub> stub_;
};

bool ParseShardRanges(const std::string& text, v1::ShardSet* out) {
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    const size_t dots = part.find("..");
    uint64_t a, b;
    if (dots == absl::string_view::npos) {
      if (!absl::SimpleAtoi(part, &a)) return false;
      b = a;
    } else if (!absl::SimpleAtoi(part.substr(0, dots), &a) ||
               !absl::SimpleAtoi(part.substr(dots + 2), &b) || b < a) {
      return false;
    }
    auto* r = out->add_ranges();
    r->set_first(a);
    r->set_last(b);
  }
  return true;
}

int Runs(Client& c, const Options& o, std::string* out, std::string* err) {
  grpc::ClientContext ctx;
  c.Prepare(&ctx);
  v1::ListRunsRequest req;
  v1::ListRunsResponse resp;
  if (int rc = FromStatus(c.stub()->ListRuns(&ctx, req, &resp), err); rc != kOk) return rc;
  if (o.output == "json") {
    *out = Json(resp);
    return kOk;
  }
  *out = absl::StrFormat("%-24s %-9s %6s %10s %6s %6s\n", "RUN", "STATE", "WORLD", "STEP", "RANKS",
                         "OPEN");
  for (const auto& r : resp.runs()) {
    std::string state = v1::RunState_Name(r.state()).substr(10);
    absl::StrAppendFormat(out, "%-24s %-9s %6d %10d %6d %6d\n", r.run_id(),
                          absl::AsciiStrToLower(state), r.world_size(), r.latest_step(),
                          r.ranks_connected(), r.open_incidents());
  }
  return kOk;
}

int Status(Client& c, const Options& o, std::string* out, std::string* err) {
  if (o.positional.size() != 1) {
    *err = "twctl status: RUN is required\n";
    return kUsage;
  }
  grpc::ClientContext ctx;
  c.Prepare(&ctx);
  v1::GetRunStatusRequest req;
  req.set_run_id(o.positional[0]);
  int points = 200;
  if (o.flags.count("points") && !absl::SimpleAtoi(o.flags.at("points"), &points)) {
    *err = "twctl status: --points needs a number\n";
    return kUsage;
  }
  req.set_window_steps(points);
  v1::GetRunStatusResponse resp;
  if (int rc = FromStatus(c.stub()->GetRunStatus(&ctx, req, &resp), err); rc != kOk) return rc;
  if (o.output == "json") {
    *out = Json(resp);
    return kOk;
  }
  const auto& m = resp.latest().metrics();
  *out = absl::StrFormat("run %s: step %d, %d of %d ranks connected, %d open incidents\n",
                         resp.run().run_id(), resp.run().latest_step(),
                         resp.run().ranks_connected(), resp.run().world_size(),
                         resp.run().open_incidents());
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
                          StateName(i.state()), i.title());
  }
  return kOk;
}

int Incidents(Client& c, const Options& o, std::string* out, std::string* err) {
  grpc::ClientContext ctx;
  c.Prepare(&ctx);
  v1::ListIncidentsRequest req;
  req.set_open_only(o.flags.count("open") > 0);
  if (o.flags.count("run")) req.set_run_id(o.flags.at("run"));
  req.set_page_size(1000);
  v1::ListIncidentsResponse resp;
  if (int rc = FromStatus(c.stub()->ListIncidents(&ctx, req, &resp), err); rc != kOk) return rc;
  if (o.output == "json") {
    *out = Json(resp);
    return kOk;
  }
  *out = absl::StrFormat("%-7s %-16s %-4s %-18s %8s %9s  %s\n", "ID", "RUN", "TIER", "STATE",
                         "ONSET", "DETECTED", "TITLE");
  for (const auto& i : resp.incidents()) {
    std::string title = i.title();
    if (title.size() > 90) title = title.substr(0, 87) + "...";
    absl::StrAppendFormat(out, "%-7s %-16s %-4s %-18s %8d %9d  %s\n", i.incident_id(), i.run_id(),
                          TierName(i.tier()), StateName(i.state()), i.onset_step(),
                          i.detection_step(), title);
  }
  return kOk;
}

int Show(Client& c, const Options& o, std::string* out, std::string* err) {
  if (o.positional.size() != 2 || o.positional[0] != "show") {
    *err = "usage: twctl incident show ID\n";
    return kUsage;
  }
  grpc::ClientContext ctx;
  c.Prepare(&ctx);
  v1::GetIncidentRequest req;
  req.set_incident_id(o.positional[1]);
  v1::GetIncidentResponse resp;
  if (int rc = FromStatus(c.stub()->GetIncident(&ctx, req, &resp), err); rc != kOk) return rc;
  if (o.output == "json") {
    *out = Json(resp);
    return kOk;
  }
  const v1::Incident& i = resp.incident();
  const v1::DiagnosticSummary& s = i.summary();
  *out = absl::StrFormat("%s  run %s  tier %s  %s\nonset step %d, detected at step %d\n\n%s\n\n",
                         i.incident_id(), i.run_id(), TierName(i.tier()), StateName(i.state()),
                         s.onset_step(), s.detection_step(), s.explanation());
  std::vector<std::pair<int64_t, double>> lz, loss, ratio, p50, p99;
  for (const auto& p : s.log_z_trend()) lz.emplace_back(p.step(), p.value());
  for (const auto& p : s.loss_around_onset()) loss.emplace_back(p.step(), p.value());
  for (const auto& p : s.loss_ema_ratio_around_onset()) ratio.emplace_back(p.step(), p.value());
  if (!lz.empty()) *out += Chart("log_z over the 5,000 steps before the onset", lz) + "\n";
  if (!loss.empty()) *out += Chart("loss around the onset", loss) + "\n";
  if (s.grad_norm_percentiles_size() > 0) {
    *out += "grad_norm percentiles before the onset\n";
    absl::StrAppendFormat(out, "  %-17s %9s %9s %9s %9s %7s\n", "steps", "p50", "p90", "p99",
                          "max", "n");
    for (const auto& w : s.grad_norm_percentiles()) {
      absl::StrAppendFormat(out, "  %8d..%-8d %9s %9s %9s %9s %7d\n", w.first_step(),
                            w.last_step(), Fmt(w.p50()), Fmt(w.p90()), Fmt(w.p99()),
                            Fmt(w.max()), w.sample_count());
    }
    *out += "\n";
  }
  if (s.tensor_breakdown_size() > 0) {
    // Which tensors held the nonfinite values, on which ranks: where to look.
    *out += "nonfinite gradients by tensor\n";
    absl::StrAppendFormat(out, "  %-40s %12s %14s  %s\n", "tensor", "nonfinite", "elements",
                          "ranks");
    for (const auto& t : s.tensor_breakdown()) {
      absl::StrAppendFormat(out, "  %-40s %12d %14d  %s\n", t.name(), t.nonfinite_count(),
                            t.element_count(), absl::StrJoin(t.ranks(), ","));
    }
    *out += "\n";
  }
  if (s.suspect_shards().ranges_size() > 0) {
    const auto& r = s.suspect_shards().ranges(0);
    absl::StrAppendFormat(out, "shards onset..detection: %d..%d (%d ids)\n", r.first(), r.last(),
                          s.suspect_shards().shard_ids_size());
  }
  if (s.has_recommended_checkpoint()) {
    absl::StrAppendFormat(out, "recommended checkpoint: step %d %s\n",
                          s.recommended_checkpoint().step(), s.recommended_checkpoint().uri());
  }
  for (const auto& a : s.recommended_actions()) {
    absl::StrAppendFormat(out, "recommended: %s\n", a.description());
  }
  for (const auto& d : i.decisions()) {
    if (d.actor().kind() != v1::ACTOR_KIND_HUMAN) {
      absl::StrAppendFormat(out, "decision %s: taken by %s on every rank\n", d.decision_id(),
                            d.actor().id());
      continue;
    }
    absl::StrAppendFormat(out, "decision %s: %s by %s: \"%s\"\n", d.decision_id(),
                          d.kind() == v1::DECISION_KIND_APPROVE_ROLLBACK ? "approved" : "rejected",
                          d.actor().id(), d.comment());
  }
  if (!s.approve_command().empty()) absl::StrAppendFormat(out, "\napprove with:\n  %s\n", s.approve_command());
  return kOk;
}

int Rollback(Client& c, const Options& o, const Prompt& prompt, std::string* out,
             std::string* err) {
  if (o.positional.size() != 2 || (o.positional[0] != "approve" && o.positional[0] != "reject")) {
    *err = "usage: twctl rollback approve|reject ID ...\n";
    return kUsage;
  }
  const std::string id = o.positional[1];
  const std::string comment = o.flags.count("comment") ? o.flags.at("comment") : "";
  if (o.positional[0] == "reject") {
    if (comment.empty()) {
      *err = "twctl rollback reject: --comment is required (it goes in the audit log)\n";
      return kUsage;
    }
    grpc::ClientContext ctx;
    c.Prepare(&ctx);
    v1::RejectRollbackRequest req;
    req.set_incident_id(id);
    req.set_comment(comment);
    v1::RejectRollbackResponse resp;
    if (int rc = FromStatus(c.stub()->RejectRollback(&ctx, req, &resp), err); rc != kOk) {
      return rc;
    }
    *out = o.output == "json" ? Json(resp)
                              : absl::StrFormat("%s rejected (%s): %s\n", id,
                                                resp.decision().decision_id(), comment);
    return kOk;
  }
  v1::ApproveRollbackRequest req;
  req.set_incident_id(id);
  req.set_comment(comment);
  if (o.flags.count("to-step")) {
    int64_t step;
    if (!absl::SimpleAtoi(o.flags.at("to-step"), &step)) {
      *err = "twctl rollback approve: --to-step needs a step number\n";
      return kUsage;
    }
    req.set_to_step(step);
  }
  if (o.flags.count("quarantine-shards") &&
      !ParseShardRanges(o.flags.at("quarantine-shards"), req.mutable_quarantine_shards())) {
    *err = "twctl rollback approve: --quarantine-shards takes A..B[,C..D]\n";
    return kUsage;
  }
  if (o.flags.count("skip-steps")) {
    // A..B, or "none".
    const std::string v = o.flags.at("skip-steps");
    const size_t dots = v.find("..");
    int64_t a = 0, b = -1;
    if (v != "none" && (dots == std::string::npos || !absl::SimpleAtoi(v.substr(0, dots), &a) ||
                        !absl::SimpleAtoi(v.substr(dots + 2), &b) || a < 0 || b < a)) {
      *err = "twctl rollback approve: --skip-steps takes A..B or none\n";
      return kUsage;
    }
    req.mutable_skip_steps()->set_first(a);
    req.mutable_skip_steps()->set_last(b);
  }
  if (o.flags.count("z-loss-alpha")) {
    double a;
    if (!absl::SimpleAtod(o.flags.at("z-loss-alpha"), &a) || !(a >= 0)) {
      *err = "twctl rollback approve: --z-loss-alpha needs a number >= 0\n";
      return kUsage;
    }
    req.set_z_loss_alpha(a);
  }
  // First a dry run: the human sees exactly what will happen.
  req.set_dry_run(true);
  v1::ApproveRollbackResponse plan;
  {
    grpc::ClientContext ctx;
    c.Prepare(&ctx);
    if (int rc = FromStatus(c.stub()->ApproveRollback(&ctx, req, &plan), err); rc != kOk) {
      return rc;
    }
  }
  const v1::RollbackPlan& p = plan.decision().plan();
  std::string what = absl::StrFormat("roll back run %s to step %d (%s)", plan.decision().run_id(),
                                     p.target_step(), p.checkpoint_uri());
  for (const auto& r : p.quarantine().ranges()) {
    absl::StrAppendFormat(&what, ", quarantine shards %d..%d", r.first(), r.last());
  }
  if (p.has_skip_steps()) {
    absl::StrAppendFormat(&what, ", skip the batches of steps %d..%d on every rank",
                          p.skip_steps().first(), p.skip_steps().last());
  }
  for (const auto& st : p.settings()) {
    if (st.has_z_loss_alpha()) absl::StrAppendFormat(&what, ", z-loss alpha %g", st.z_loss_alpha());
  }
  if (o.flags.count("dry-run")) {
    *out = o.output == "json" ? Json(plan) : absl::StrCat("dry run: would ", what, "\n");
    return kOk;
  }
  if (!o.flags.count("yes") && !prompt(absl::StrCat(id, ": ", what, "? [y/N] "))) {
    *err = "twctl: not approved\n";
    return kError;
  }
  req.set_dry_run(false);
  // A retry of this very command must not approve twice.
  req.set_idempotency_key(absl::StrCat("twctl-", id, "-", p.target_step(), "-",
                                       std::hash<std::string>()(what + comment)));
  v1::ApproveRollbackResponse resp;
  grpc::ClientContext ctx;
  c.Prepare(&ctx);
  if (int rc = FromStatus(c.stub()->ApproveRollback(&ctx, req, &resp), err); rc != kOk) return rc;
  *out = o.output == "json"
             ? Json(resp)
             : absl::StrFormat("%s approved (%s%s): %s; command %s sent to every rank\n", id,
                               resp.decision().decision_id(), resp.replayed() ? ", already" : "",
                               what, resp.decision().command_id());
  return kOk;
}

int Shards(Client& c, const Options& o, std::string* out, std::string* err) {
  if (o.positional.size() != 1) {
    *err = "twctl shards: RUN is required\n";
    return kUsage;
  }
  grpc::ClientContext ctx;
  c.Prepare(&ctx);
  v1::ListQuarantinedShardsRequest req;
  req.set_run_id(o.positional[0]);
  v1::ListQuarantinedShardsResponse resp;
  if (int rc = FromStatus(c.stub()->ListQuarantinedShards(&ctx, req, &resp), err); rc != kOk) {
    return rc;
  }
  if (o.output == "json") {
    *out = Json(resp);
    return kOk;
  }
  *out = absl::StrFormat("%-24s %-8s %-8s %s\n", "SHARDS", "INCIDENT", "DECISION", "SINCE");
  for (const auto& e : resp.entries()) {
    const auto& r = e.shards().ranges(0);
    absl::StrAppendFormat(
        out, "%-24s %-8s %-8s %s\n", absl::StrCat(r.first(), "..", r.last()), e.incident_id(),
        e.decision_id(),
        UtcTime(e.added_at().seconds()));
  }
  if (resp.entries_size() == 0) *out += "(none quarantined)\n";
  return kOk;
}

int Report(Client& c, const Options& o, std::string* out, std::string* err) {
  if (o.positional.size() != 1) {
    *err = "usage: twctl report RUN [--out FILE]\n";
    return kUsage;
  }
  const std::string& run = o.positional[0];
  const std::string path =
      o.flags.count("out") ? o.flags.at("out") : absl::StrCat("trainwatch-report-", run, ".html");
  v1::GetRunStatusResponse status;
  {
    grpc::ClientContext ctx;
    c.Prepare(&ctx);
    v1::GetRunStatusRequest req;
    req.set_run_id(run);
    req.set_window_steps(100000);  // the server's most; longer runs show their last 100k
    req.set_max_points(20000);
    if (int rc = FromStatus(c.stub()->GetRunStatus(&ctx, req, &status), err); rc != kOk) return rc;
  }
  std::vector<v1::GetRunStatusResponse> earlier;
  for (int64_t a = 0; a < status.run().attempt(); ++a) {
    grpc::ClientContext ctx;
    c.Prepare(&ctx);
    v1::GetRunStatusRequest req;
    req.set_run_id(run);
    req.set_window_steps(100000);
    req.set_max_points(20000);
    req.set_attempt(a);
    earlier.emplace_back();
    if (int rc = FromStatus(c.stub()->GetRunStatus(&ctx, req, &earlier.back()), err); rc != kOk) {
      return rc;
    }
  }
  v1::ListIncidentsResponse incidents;
  for (std::string token;;) {
    grpc::ClientContext ctx;
    c.Prepare(&ctx);
    v1::ListIncidentsRequest req;
    req.set_run_id(run);
    req.set_page_size(1000);
    req.set_page_token(token);
    v1::ListIncidentsResponse page;
    if (int rc = FromStatus(c.stub()->ListIncidents(&ctx, req, &page), err); rc != kOk) return rc;
    for (auto& i : *page.mutable_incidents()) *incidents.add_incidents() = std::move(i);
    token = page.next_page_token();
    if (token.empty()) break;
  }
  v1::ListQuarantinedShardsResponse shards;
  {
    grpc::ClientContext ctx;
    c.Prepare(&ctx);
    v1::ListQuarantinedShardsRequest req;
    req.set_run_id(run);
    if (int rc = FromStatus(c.stub()->ListQuarantinedShards(&ctx, req, &shards), err); rc != kOk) {
      return rc;
    }
  }
  const std::string html = RenderReportHtml(status, earlier, incidents, shards);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << html;
  f.close();
  if (!f) {
    *err = absl::StrCat("twctl report: cannot write ", path, "\n");
    return kError;
  }
  *out = absl::StrFormat("wrote %s: %d steps charted, %d incidents, %d quarantined ranges\n", path,
                         status.recent_size(), incidents.incidents_size(), shards.entries_size());
  return kOk;
}

// Incident changes as they happen, a line each (a JSON object a line with
// -o json), until Ctrl-C, --count events or --timeout seconds.
int Watch(Client& c, const Options& o, const Emit& emit, std::string* out, std::string* err) {
  int64_t count = 0, timeout_s = 0;
  if ((o.flags.count("count") && (!absl::SimpleAtoi(o.flags.at("count"), &count) || count < 0)) ||
      (o.flags.count("timeout") &&
       (!absl::SimpleAtoi(o.flags.at("timeout"), &timeout_s) || timeout_s < 0))) {
    *err = "twctl watch: --count and --timeout need a number\n";
    return kUsage;
  }
  auto say = [&](const std::string& line) {
    if (emit) {
      emit(line);
    } else {
      *out += line;
    }
  };
  grpc::ClientContext ctx;
  c.Prepare(&ctx);
  ctx.set_deadline(timeout_s > 0 ? std::chrono::system_clock::now() + std::chrono::seconds(timeout_s)
                                 : std::chrono::system_clock::time_point::max());
  v1::WatchIncidentsRequest req;
  if (o.flags.count("run")) req.set_run_id(o.flags.at("run"));
  req.set_include_open(o.flags.count("open") > 0);
  auto reader = c.stub()->WatchIncidents(&ctx, req);
  if (o.output != "json") {
    say(absl::StrFormat("%-20s %-13s %-7s %-16s %-4s %-18s %s\n", "TIME", "EVENT", "ID", "RUN",
                        "TIER", "STATE", "TITLE"));
  }
  v1::IncidentEvent ev;
  int64_t seen = 0;
  bool enough = false;
  while (!enough && reader->Read(&ev)) {
    if (o.output == "json") {
      std::string line = Json(ev);
      say(line);
    } else {
      std::string kind = v1::IncidentEventKind_Name(ev.kind());
      kind = absl::AsciiStrToLower(kind.substr(std::string("INCIDENT_EVENT_KIND_").size()));
      const v1::Incident& i = ev.incident();
      std::string title = i.title();
      if (title.size() > 90) title = title.substr(0, 87) + "...";
      say(absl::StrFormat(
          "%-20s %-13s %-7s %-16s %-4s %-18s %s\n",
          UtcTime(ev.time().seconds()),
          kind, i.incident_id(), i.run_id(), TierName(i.tier()), StateName(i.state()), title));
    }
    enough = count > 0 && ++seen >= count;
  }
  if (enough) ctx.TryCancel();
  const grpc::Status st = reader->Finish();
  if (enough || st.error_code() == grpc::DEADLINE_EXCEEDED) return kOk;
  return FromStatus(st, err);
}

void LoadConfigFile(Options* o) {
  std::string path;
  if (const char* p = std::getenv("TWCTL_CONFIG")) {
    path = p;
  } else if (const char* home = std::getenv("HOME")) {
    path = absl::StrCat(home, "/.config/trainwatch/twctl.json");
  }
  std::ifstream in(path);
  if (!in) return;
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  absl::StatusOr<core::JsonValue> doc = core::ParseJson(text, path);
  if (!doc.ok()) return;
  auto take = [&](const char* key, std::string* dst) {
    const core::JsonValue* v = doc->Find(key);
    if (dst->empty() && v != nullptr && v->type == core::JsonValue::Type::kString) *dst = v->string;
  };
  take("server", &o->server);
  take("token", &o->token);
  take("ca_file", &o->ca_file);
}

}  // namespace

bool SplitCommandLine(const std::vector<std::string>& argv, std::string* command,
                      std::vector<std::string>* args, std::string* err) {
  std::vector<std::string> global;
  size_t i = 0;
  for (; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    bool known = false, takes_value = false;
    for (const char* name : {"-o", "--output", "--server", "--token", "--ca-file"}) {
      if (a == name) known = takes_value = true;
      if (a.rfind(std::string(name) + "=", 0) == 0) known = true;
    }
    if (!known) break;
    global.push_back(a);
    if (takes_value) {
      if (i + 1 >= argv.size()) {
        *err = absl::StrCat("twctl: ", a, " needs a value\n");
        return false;
      }
      global.push_back(argv[++i]);
    }
  }
  if (i >= argv.size()) {
    *err = "twctl: no command given\n";
    return false;
  }
  *command = argv[i];
  args->assign(argv.begin() + static_cast<std::ptrdiff_t>(i) + 1, argv.end());
  args->insert(args->end(), global.begin(), global.end());
  return true;
}

int OperatorCommand(const std::string& command, const std::vector<std::string>& args,
                    const Prompt& prompt, std::string* out, std::string* err, const Emit& emit) {
  Options o;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    std::optional<std::string> inline_value;  // --server=ADDR
    if (const size_t eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
      const std::string name = a.substr(0, eq);
      if (name == "--output" || name == "--server" || name == "--token" || name == "--ca-file") {
        inline_value = a.substr(eq + 1);
        a = name;
      }
    }
    if (a == "-o" || a == "--output" || a == "--server" || a == "--token" || a == "--ca-file") {
      if (!inline_value && i + 1 >= args.size()) {
        *err = absl::StrCat("twctl: ", a, " needs a value\n");
        return kUsage;
      }
      const std::string v = inline_value ? *inline_value : args[++i];
      if (a == "-o" || a == "--output") o.output = v;
      if (a == "--server") o.server = v;
      if (a == "--token") o.token = v;
      if (a == "--ca-file") o.ca_file = v;
    } else if (a.rfind("--", 0) == 0) {
      std::string name = a.substr(2), value;
      const size_t eq = name.find('=');
      if (eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      } else if (!IsSwitch(name)) {
        if (i + 1 >= args.size()) {
          *err = absl::StrCat("twctl: --", name, " needs a value\n");
          return kUsage;
        }
        value = args[++i];
      }
      static const std::set<std::string> kKnown = {
          "open", "yes", "dry-run", "run", "points", "to-step", "quarantine-shards",
          "z-loss-alpha", "comment", "out", "count", "timeout", "skip-steps"};
      if (!kKnown.count(name)) {
        *err = absl::StrCat("twctl: unknown flag --", name, "\n", kUsageText);
        return kUsage;
      }
      o.flags[name] = value;
    } else {
      o.positional.push_back(a);
    }
  }
  if (o.output != "table" && o.output != "json") {
    *err = "twctl: -o must be table or json\n";
    return kUsage;
  }
  if (o.server.empty()) {
    if (const char* v = std::getenv("TRAINWATCH_SERVER")) o.server = v;
  }
  if (o.token.empty()) {
    if (const char* v = std::getenv("TRAINWATCH_TOKEN")) o.token = v;
  }
  LoadConfigFile(&o);
  if (o.server.empty()) o.server = "127.0.0.1:7070";
  Client client(o);
  if (command == "runs") return Runs(client, o, out, err);
  if (command == "status") return Status(client, o, out, err);
  if (command == "incidents") return Incidents(client, o, out, err);
  if (command == "incident") return Show(client, o, out, err);
  if (command == "rollback") return Rollback(client, o, prompt, out, err);
  if (command == "shards") return Shards(client, o, out, err);
  if (command == "report") return Report(client, o, out, err);
  if (command == "watch") return Watch(client, o, emit, out, err);
  *err = absl::StrCat("twctl: unknown command '", command, "'\n", kUsageText);
  return kUsage;
}

}  // namespace trainwatch::cli
