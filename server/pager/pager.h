// Pages for tier 2 and tier 3 incidents, through a durable outbox: the page
// for an incident's state change is written in the same transaction as the
// change, so a crash can neither lose it nor send it twice (one row per
// incident, receiver and state, delivered once). A sender thread delivers
// due rows over HTTP with exponential backoff, and re-sends firing alerts to
// Alertmanager so that they stay active until the incident ends.
//
// Receivers (a JSON file, --pager_config):
//   {"grafana_url": "http://grafana:3000/d/trainwatch/trainwatch",
//    "receivers": [
//      {"name": "am",    "type": "alertmanager", "url": "http://127.0.0.1:9093"},
//      {"name": "pd",    "type": "pagerduty",
//       "url": "https://events.pagerduty.com/v2/enqueue", "routing_key_env": "PD_KEY"},
//      {"name": "slack", "type": "slack", "url_file": "/etc/trainwatch/slack-webhook"},
//      {"name": "hook",  "type": "webhook", "url": "http://127.0.0.1:8080/pages"}]}
// Optional: "min_tier" (1, 2 or 3; default 2), the lowest tier paged, and
// "resend_seconds" (1 to kMaxResendSeconds, a day; default 60), how often a
// firing alert is re-sent to Alertmanager. Anything else is an error naming
// the file, line and column.
// A followed run's incident (IncidentRow::observed, `twctl follow`) pages
// with "(observed, not enforced)" in its title and ObservedNote() in the
// summary (and, for Alertmanager, an "observed" annotation): no automatic
// action was possible, the same rollback is recommended as a manual restart.
// Secrets (PagerDuty routing keys, Slack webhook URLs) come from a file
// (`*_file`) or the environment (`*_env`) and are never logged.
//
// Thread-safety: Enqueue() from the ingest writer; the rest is internal.

#ifndef TRAINWATCH_SERVER_PAGER_H_
#define TRAINWATCH_SERVER_PAGER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "incidents/incident_text.h"
#include "pager/http_poster.h"
#include "store/store.h"
#include "trainwatch/core/clock.h"

namespace trainwatch::server {

struct Receiver {
  enum class Type { kAlertmanager, kPagerDuty, kSlack, kWebhook };
  std::string name;
  Type type = Type::kWebhook;
  std::string url;          // for Slack, the webhook URL (a secret)
  std::string routing_key;  // PagerDuty
};

// The longest resend_seconds a config may ask for.
inline constexpr int kMaxResendSeconds = 86'400;

struct PagerConfig {
  std::string grafana_url;
  std::vector<Receiver> receivers;
  int min_tier = 2;
  int64_t resend_ms = 60'000;    // Alertmanager re-send while firing
  int64_t max_backoff_ms = 300'000;
};

absl::StatusOr<PagerConfig> ParsePagerConfig(absl::string_view json, absl::string_view source);
absl::StatusOr<PagerConfig> LoadPagerConfig(const std::string& path);

// The page's text, shared by every format.
struct PageContent {
  std::string event;  // "trigger", "update", "resolve"
  IncidentRow incident;
  std::string summary;          // one paragraph
  // Empty when there is nothing to approve, or no checkpoint to approve a
  // rollback to.
  std::string approve_command;
  std::string dashboard_url;
};

// Builds the HTTP body (JSON) a receiver expects, and the URL to post to.
std::string PagePayload(const Receiver& r, const PageContent& c, int64_t now_ms);
std::string PageUrl(const Receiver& r);

class Pager : public IncidentOutbox {
 public:
  // REQUIRES: `poster` outlives the Pager.
  Pager(Store* store, PagerConfig config, core::Clock* clock,
        HttpPoster* poster = DefaultHttpPoster());
  ~Pager() override;

  // Outbox rows for an incident's change, to be written in the caller's
  // batch. Empty below min_tier or without receivers.
  std::vector<OutboxRow> Rows(const IncidentRow& incident, const std::string& summary,
                              int64_t now_ms) const override;
  void Start();
  void Stop();
  // Nudges the sender (rows were committed).
  void Wake() override;

  int64_t sent_total() const { return sent_.load(); }
  int64_t failed_total() const { return failed_.load(); }
  const PagerConfig& config() const { return config_; }

 private:
  void Loop();
  // OK on a 2xx answer; otherwise why not, without the URL.
  absl::Status Post(const Receiver& r, const std::string& body);

  Store* store_;
  PagerConfig config_;
  core::Clock* clock_;
  HttpPoster* poster_;
  std::atomic<int64_t> sent_{0}, failed_{0};
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_PAGER_H_
