#include "report.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "proto_text.h"
#include "trainwatch/core/config.h"
#include "trainwatch/core/json.h"

namespace trainwatch::cli {
namespace {

namespace v1 = trainwatch::v1;

constexpr int kWidth = 960, kHeight = 170, kLeft = 72, kRight = 12, kTop = 12, kBottom = 24;

const char* TierColour(int tier) {
  switch (tier) {
    case 1:
      return "#e08a00";
    case 2:
      return "#d62728";
    case 3:
      return "#7b2cbf";
    default:
      return "#7f7f7f";
  }
}

std::string Number(double v) {
  if (!std::isfinite(v)) return std::isnan(v) ? "NaN" : (v > 0 ? "inf" : "-inf");
  const double a = std::fabs(v);
  if (a != 0.0 && (a < 1e-3 || a >= 1e5)) return absl::StrFormat("%.3g", v);
  return absl::StrFormat("%.4g", v);
}

using Points = std::vector<std::pair<int64_t, double>>;  // NaN where reported nonfinite

struct Series {
  const char* name;
  const char* unit;
  Points points;                // the current attempt
  std::vector<Points> earlier;  // abandoned attempts, oldest first
};

// One chart: the series as a polyline (broken where a value is missing or
// nonfinite, nonfinite steps marked at the top edge), every incident as a
// vertical line at its detection step, pages with their onset band.
std::string Chart(const Series& s, int64_t first, int64_t last,
                  const v1::ListIncidentsResponse& incidents) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  auto range = [&](const Points& pts) {
    for (const auto& [step, v] : pts) {
      if (std::isfinite(v)) {
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
    }
  };
  range(s.points);
  for (const Points& e : s.earlier) range(e);
  if (!std::isfinite(lo)) lo = hi = 0.0;
  if (hi - lo < 1e-12) {
    hi += 0.5 * std::max(1e-9, std::fabs(hi));
    lo -= 0.5 * std::max(1e-9, std::fabs(lo));
  }
  const double span = static_cast<double>(std::max<int64_t>(1, last - first));
  const double pw = kWidth - kLeft - kRight, ph = kHeight - kTop - kBottom;
  auto x = [&](int64_t step) { return kLeft + pw * static_cast<double>(step - first) / span; };
  auto y = [&](double v) { return kTop + ph * (1.0 - (v - lo) / (hi - lo)); };

  std::string svg = absl::StrFormat(
      "<svg class=\"chart\" viewBox=\"0 0 %d %d\" width=\"%d\" height=\"%d\" role=\"img\" "
      "aria-label=\"%s\">\n",
      kWidth, kHeight, kWidth, kHeight, HtmlEscape(s.name));
  absl::StrAppendFormat(&svg,
                        "<rect x=\"%d\" y=\"%d\" width=\"%.0f\" height=\"%.0f\" "
                        "class=\"plot\"/>\n",
                        kLeft, kTop, pw, ph);
  for (const auto& i : incidents.incidents()) {
    const int tier = TierNumber(i.tier());
    if (i.detection_step() < first || i.onset_step() > last) continue;
    const std::string title = HtmlEscape(absl::StrCat(i.incident_id(), ": ", i.title()));
    if (tier >= 2 && i.onset_step() < i.detection_step()) {
      const double a = x(std::max(first, i.onset_step())),
                   b = x(std::min(last, i.detection_step()));
      absl::StrAppendFormat(&svg,
                            "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%.0f\" "
                            "fill=\"%s\" opacity=\"0.12\"><title>%s</title></rect>\n",
                            a, kTop, std::max(1.0, b - a), ph, TierColour(tier), title);
    }
    const double xd = x(i.detection_step());
    absl::StrAppendFormat(&svg,
                          "<line class=\"incident tier%d\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" "
                          "y2=\"%.0f\" stroke=\"%s\"><title>%s</title></line>\n",
                          tier, xd, xd, kTop, kTop + ph, TierColour(tier), title);
  }
  auto draw = [&](const Points& pts, const char* cls) {
    std::string points;
    size_t in_line = 0;
    auto flush = [&]() {
      if (in_line >= 1) {
        absl::StrAppend(&svg, "<polyline class=\"", cls, "\" points=\"", points, "\"/>\n");
      }
      points.clear();
      in_line = 0;
    };
    for (const auto& [step, v] : pts) {
      if (step < first || step > last) continue;
      if (!std::isfinite(v)) {
        flush();
        absl::StrAppendFormat(&svg,
                              "<circle class=\"nonfinite\" cx=\"%.1f\" cy=\"%d\" r=\"3\">"
                              "<title>step %d: %s</title></circle>\n",
                              x(step), kTop + 3, step, Number(v));
        continue;
      }
      absl::StrAppendFormat(&points, "%s%.1f,%.1f", in_line ? " " : "", x(step), y(v));
      ++in_line;
    }
    flush();
  };
  for (const Points& e : s.earlier) draw(e, "abandoned");
  draw(s.points, "series");
  // Axes: the value range on the left, the step range below.
  absl::StrAppendFormat(&svg,
                        "<text x=\"%d\" y=\"%d\" class=\"axis\" text-anchor=\"end\">%s</text>\n",
                        kLeft - 6, kTop + 10, Number(hi));
  absl::StrAppendFormat(&svg,
                        "<text x=\"%d\" y=\"%.0f\" class=\"axis\" text-anchor=\"end\">%s</text>\n",
                        kLeft - 6, kTop + ph, Number(lo));
  absl::StrAppendFormat(&svg, "<text x=\"%d\" y=\"%d\" class=\"axis\">step %d</text>\n", kLeft,
                        kHeight - 6, first);
  absl::StrAppendFormat(&svg,
                        "<text x=\"%d\" y=\"%d\" class=\"axis\" text-anchor=\"end\">"
                        "step %d</text>\n",
                        kWidth - kRight, kHeight - 6, last);
  absl::StrAppendFormat(&svg, "<text x=\"%d\" y=\"%d\" class=\"name\">%s%s</text>\n", kLeft + 6,
                        kTop + 16, HtmlEscape(s.name),
                        s.unit[0] ? absl::StrCat(" (", s.unit, ")") : "");
  svg += "</svg>\n";
  return svg;
}

}  // namespace

std::string RulesText(const v1::RunInfo& run) {
  std::string out = absl::StrCat("rules: ", run.rules_source().empty() ? "unknown" : run.rules_source());
  // Only what differs from the defaults: the whole set is a page long.
  absl::StatusOr<core::JsonValue> given = core::ParseJson(run.rules_json(), "rules_json");
  absl::StatusOr<core::JsonValue> defaults =
      core::ParseJson(core::RuleConfigToJson(core::RuleConfig()), "defaults");
  if (!run.rules_json().empty() && given.ok() && defaults.ok()) {
    std::vector<std::string> differ;
    for (const auto& [key, value] : given->object) {
      const core::JsonValue* d = defaults->Find(key);
      if (value.type != core::JsonValue::Type::kNumber && value.type != core::JsonValue::Type::kBool) {
        continue;  // the bounds object
      }
      if (d == nullptr || d->number != value.number || d->boolean != value.boolean) {
        differ.push_back(absl::StrCat(key, "=", value.type == core::JsonValue::Type::kBool
                                                    ? (value.boolean ? "true" : "false")
                                                    : value.string));
      }
    }
    absl::StrAppend(&out, differ.empty() ? " (the defaults)"
                                         : absl::StrCat(" (", absl::StrJoin(differ, ", "),
                                                        "; the rest the defaults)"));
  }
  absl::StrAppend(&out, "; ", run.agent_decisions(), " agent decision(s), ",
                  run.decision_divergences(), " divergence(s) from the server's engine");
  return out;
}

std::string HtmlEscape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string RenderReportHtml(const v1::GetRunStatusResponse& status,
                             const std::vector<v1::GetRunStatusResponse>& earlier,
                             const v1::ListIncidentsResponse& incidents,
                             const v1::ListQuarantinedShardsResponse& shards) {
  const v1::RunInfo& run = status.run();
  Series series[] = {{"loss", "nats", {}, {}},
                     {"grad_norm", "before clipping", {}, {}},
                     {"log_z", "output softmax log partition function", {}, {}},
                     {"loss_ema_ratio", "", {}, {}},
                     {"nan_frac", "", {}, {}}};
  int64_t first = std::numeric_limits<int64_t>::max(), last = std::numeric_limits<int64_t>::min();
  // Each series of one attempt into `pick(series)`.
  auto collect = [&](const v1::GetRunStatusResponse& r, auto pick) {
    for (const auto& p : r.recent()) {
      const auto& m = p.metrics();
      first = std::min(first, p.step());
      last = std::max(last, p.step());
      if (m.has_loss()) pick(series[0]).emplace_back(p.step(), m.loss());
      if (m.has_grad_norm()) pick(series[1]).emplace_back(p.step(), m.grad_norm());
      if (m.has_log_z()) pick(series[2]).emplace_back(p.step(), m.log_z());
      if (m.has_loss_ema_ratio()) pick(series[3]).emplace_back(p.step(), m.loss_ema_ratio());
      if (m.has_nan_frac()) pick(series[4]).emplace_back(p.step(), m.nan_frac());
    }
  };
  for (const auto& e : earlier) {
    for (Series& s : series) s.earlier.emplace_back();
    collect(e, [](Series& s) -> Points& { return s.earlier.back(); });
  }
  collect(status, [](Series& s) -> Points& { return s.points; });
  if (first > last) first = last = 0;

  int by_tier[4] = {};
  for (const auto& i : incidents.incidents()) by_tier[TierNumber(i.tier())]++;

  std::string h;
  absl::StrAppend(
      &h,
      "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
      "<title>trainwatch: ",
      HtmlEscape(run.run_id()), "</title>\n",
      "<style>\n"
      "body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1000px}\n"
      "h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 8px}\n"
      ".meta{color:#555}.plot{fill:#fafafa;stroke:#ddd}\n"
      ".series{fill:none;stroke:#1f77b4;stroke-width:1.2}\n"
      ".abandoned{fill:none;stroke:#b0b0b0;stroke-width:1.2;stroke-dasharray:3 2}\n"
      ".nonfinite{fill:#7b2cbf}.incident{stroke-width:1.5}\n"
      ".axis{font-size:11px;fill:#666}.name{font-size:12px;font-weight:600;fill:#333}\n"
      "table{border-collapse:collapse;width:100%}td,th{border-bottom:1px solid #e5e5e5;"
      "padding:4px 6px;text-align:left;vertical-align:top}\n"
      ".t1{color:#e08a00}.t2{color:#d62728}.t3{color:#7b2cbf}.t0{color:#7f7f7f}\n"
      "</style></head><body>\n");
  absl::StrAppend(&h, "<h1>run ", HtmlEscape(run.run_id()), "</h1>\n");
  if (run.observed()) {
    absl::StrAppend(&h, "<p class=\"meta\"><b>followed from its log (twctl follow): ",
                    kObservedText, "</b>; no update was skipped nor the trainer halted.</p>\n");
  }
  absl::StrAppendFormat(
      &h,
      "<p class=\"meta\">steps %d to %d shown (%d points), world size %d, attempt %d, "
      "%d incident(s): "
      "<span class=\"t1\">%d tier 1</span>, <span class=\"t2\">%d tier 2</span>, "
      "<span class=\"t3\">%d tier 3</span>, <span class=\"t0\">%d early warning(s)</span>",
      first, last, status.recent_size(), run.world_size(), run.attempt(),
      incidents.incidents_size(), by_tier[1], by_tier[2], by_tier[3], by_tier[0]);
  if (status.has_latest_checkpoint()) {
    absl::StrAppend(&h, "; latest checkpoint at step ", status.latest_checkpoint().step());
  }
  absl::StrAppend(&h, ".</p>\n<p class=\"meta\">", HtmlEscape(RulesText(run)));
  h += ".</p>\n<p class=\"meta\">Vertical lines mark incidents at their detection step (hover "
       "for the title); a shaded band runs from a page's onset to its detection; dots at the "
       "top mark nonfinite values; dashed grey is what a rollback undid (earlier attempts).</p>\n";
  for (const Series& s : series) h += Chart(s, first, last, incidents);

  if (status.attempts_size() > 1) {
    h += "<h2>attempts</h2>\n<table><tr><th>attempt</th><th>how it began</th></tr>\n";
    for (const auto& a : status.attempts()) {
      absl::StrAppendFormat(&h, "<tr><td>%d%s</td><td>%s</td></tr>\n", a.attempt(),
                            a.attempt() == run.attempt() ? " (current)" : "",
                            HtmlEscape(AttemptText(a)));
    }
    h += "</table>\n";
  }
  h += "<h2>incidents</h2>\n";
  if (incidents.incidents_size() == 0) {
    h += "<p>none</p>\n";
  } else {
    h += "<table><tr><th>id</th><th>tier</th><th>state</th><th>onset</th><th>detected</th>"
         "<th>opened</th><th>what</th></tr>\n";
    for (const auto& i : incidents.incidents()) {
      const int tier = TierNumber(i.tier());
      absl::StrAppendFormat(&h,
                            "<tr><td>%s</td><td class=\"t%d\">%d</td><td>%s</td><td>%d</td>"
                            "<td>%d</td><td>%s</td><td>%s</td></tr>\n",
                            HtmlEscape(i.incident_id()), tier, tier,
                            HtmlEscape(StateName(i.state())), i.onset_step(), i.detection_step(),
                            UtcTime(i.opened_at().seconds()), HtmlEscape(IncidentTitle(i)));
    }
    h += "</table>\n";
  }
  h += "<h2>quarantined shards</h2>\n";
  if (shards.entries_size() == 0) {
    h += "<p>none</p>\n";
  } else {
    h += "<table><tr><th>shards</th><th>incident</th><th>decision</th><th>since</th></tr>\n";
    for (const auto& e : shards.entries()) {
      std::vector<std::string> ranges;
      for (const auto& r : e.shards().ranges())
        ranges.push_back(absl::StrCat(r.first(), "..", r.last()));
      for (const std::string& name : e.shards().names()) ranges.push_back(name);
      absl::StrAppendFormat(&h, "<tr><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>\n",
                            HtmlEscape(absl::StrJoin(ranges, ", ")), HtmlEscape(e.incident_id()),
                            HtmlEscape(e.decision_id()), UtcTime(e.added_at().seconds()));
    }
    h += "</table>\n";
  }
  h += "</body></html>\n";
  return h;
}

}  // namespace trainwatch::cli
