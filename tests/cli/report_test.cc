// twctl report's page, rendered from hand-made responses: every metric a
// chart, nonfinite values marked, earlier attempts drawn faded, incidents
// as lines and bands, and everything a trainer or an operator wrote escaped.

#include "report.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <regex>
#include <string>

namespace trainwatch::cli {
namespace {

namespace v1 = trainwatch::v1;

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

TEST_CASE("report: charts and incidents and shards on one page", "[twctl][report]") {
  v1::GetRunStatusResponse status;
  status.mutable_run()->set_run_id("run<&>\"x\"");
  status.mutable_run()->set_world_size(8);
  status.mutable_run()->set_attempt(1);
  for (int64_t s = 0; s < 100; ++s) {
    auto* p = status.add_recent();
    p->set_step(s);
    p->mutable_metrics()->set_loss(s == 90 ? NAN : 3.0 - 0.01 * static_cast<double>(s));
    p->mutable_metrics()->set_grad_norm(1.0);
    p->mutable_metrics()->set_log_z(8.0);
    p->mutable_metrics()->set_loss_ema_ratio(1.0);
    p->mutable_metrics()->set_nan_frac(s == 90 ? 0.5 : 0.0);
  }
  std::vector<v1::GetRunStatusResponse> earlier(1);
  for (int64_t s = 0; s < 80; ++s) {
    auto* p = earlier[0].add_recent();
    p->set_step(s);
    p->mutable_metrics()->set_log_z(8.0 + (s > 50 ? 0.2 * static_cast<double>(s - 50) : 0.0));
  }
  v1::ListIncidentsResponse incidents;
  auto* i = incidents.add_incidents();
  i->set_incident_id("I-2");
  i->set_tier(v1::TIER_LOGIT_DRIFT);
  i->set_state(v1::INCIDENT_STATE_RESOLVED);
  i->set_onset_step(50);
  i->set_detection_step(70);
  i->set_title("log_z <script>alert(1)</script> rose");
  v1::ListQuarantinedShardsResponse shards;
  auto* e = shards.add_entries();
  e->set_incident_id("I-2");
  auto* r = e->mutable_shards()->add_ranges();
  r->set_first(100);
  r->set_last(140);

  const std::string html = RenderReportHtml(status, earlier, incidents, shards);
  CHECK(html.rfind("<!doctype html>", 0) == 0);
  CHECK(Count(html, "<svg") == 5);
  CHECK(Count(html, "</svg>") == 5);
  // The loss line breaks at the NaN, which is marked instead.
  CHECK(Count(html, "<polyline class=\"series\"") == 4 + 2);
  CHECK(Count(html, "class=\"nonfinite\"") == 1);
  CHECK(html.find("step 90: NaN") != std::string::npos);
  // The abandoned attempt: only log_z had values there.
  CHECK(Count(html, "class=\"abandoned\"") == 1);
  // The page: a line in each chart, its onset band too.
  CHECK(Count(html, "class=\"incident tier2\"") == 5);
  CHECK(Count(html, "opacity=\"0.12\"") == 5);
  CHECK(html.find("100..140") != std::string::npos);
  CHECK(html.find("attempt 1") != std::string::npos);
  // Nothing a trainer or an operator wrote reaches the page unescaped.
  CHECK(html.find("<script>") == std::string::npos);
  CHECK(html.find("&lt;script&gt;alert(1)&lt;/script&gt;") != std::string::npos);
  CHECK(html.find("run&lt;&amp;&gt;&quot;x&quot;") != std::string::npos);
  // Every point of a polyline lies inside the chart.
  const std::regex point(R"((-?[0-9.]+),(-?[0-9.]+))");
  const std::string first_line = html.substr(html.find("points=\""), 4000);
  for (auto it = std::sregex_iterator(first_line.begin(), first_line.end(), point);
       it != std::sregex_iterator(); ++it) {
    const double x = std::stod((*it)[1]), y = std::stod((*it)[2]);
    CHECK(x >= 0.0);
    CHECK(x <= 960.0);
    CHECK(y >= 0.0);
    CHECK(y <= 170.0);
  }
}

TEST_CASE("report: an empty run still renders", "[twctl][report]") {
  const std::string html = RenderReportHtml({}, {}, {}, {});
  CHECK(Count(html, "<svg") == 5);
  CHECK(html.find("<p>none</p>") != std::string::npos);
}

}  // namespace
}  // namespace trainwatch::cli
