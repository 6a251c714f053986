#include "pager/pager.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "incidents/incident_text.h"
#include "common/log.h"
#include "trainwatch/core/file_system.h"
#include "trainwatch/core/json.h"

namespace trainwatch::server {

namespace {

std::string Quote(absl::string_view s) {
  std::string out;
  core::AppendJsonString(&out, s);
  return out;
}

std::string Iso8601(int64_t ms) {
  const std::time_t t = static_cast<std::time_t>(ms / 1000);
  std::tm tm;
  gmtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return absl::StrFormat("%s.%03dZ", buf, static_cast<int>(ms % 1000));
}

absl::StatusOr<std::string> Secret(const core::JsonValue& r, const std::string& key,
                                   absl::string_view source) {
  if (const core::JsonValue* v = r.Find(key); v && v->type == core::JsonValue::Type::kString) {
    return v->string;
  }
  if (const core::JsonValue* v = r.Find(key + "_env");
      v && v->type == core::JsonValue::Type::kString) {
    const char* value = std::getenv(v->string.c_str());
    if (value == nullptr || *value == '\0') {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": environment variable ", v->string, " is not set"));
    }
    return std::string(value);
  }
  if (const core::JsonValue* v = r.Find(key + "_file");
      v && v->type == core::JsonValue::Type::kString) {
    absl::StatusOr<std::string> text = core::LocalFileSystem().ReadFile(v->string);
    if (!text.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": ", text.status().message()));
    }
    return std::string(absl::StripAsciiWhitespace(*text));
  }
  return std::string();
}

}  // namespace

absl::StatusOr<PagerConfig> ParsePagerConfig(absl::string_view json, absl::string_view source) {
  absl::StatusOr<core::JsonValue> doc = core::ParseJson(json, source);
  if (!doc.ok()) return doc.status();
  PagerConfig c;
  if (const core::JsonValue* g = doc->Find("grafana_url")) c.grafana_url = g->string;
  // Range-checked before the casts: a double outside int's range (1e10,
  // NaN) converted to int is undefined behaviour, not a clear error.
  if (const core::JsonValue* t = doc->Find("min_tier")) {
    if (t->type != core::JsonValue::Type::kNumber || !(t->number >= 1 && t->number <= 3) ||
        t->number != static_cast<int>(t->number)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s:%d:%d: min_tier must be 1, 2 or 3", source, t->line, t->column));
    }
    c.min_tier = static_cast<int>(t->number);
  }
  if (const core::JsonValue* t = doc->Find("resend_seconds")) {
    if (t->type != core::JsonValue::Type::kNumber ||
        !(t->number >= 1 && t->number <= kMaxResendSeconds)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s:%d:%d: resend_seconds must be in [1, %d]", source, t->line,
                          t->column, kMaxResendSeconds));
    }
    c.resend_ms = static_cast<int64_t>(t->number * 1000);
  }
  const core::JsonValue* receivers = doc->Find("receivers");
  if (receivers == nullptr || receivers->type != core::JsonValue::Type::kArray) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": expected \"receivers\": [...]"));
  }
  for (const core::JsonValue& r : receivers->array) {
    const std::string where = absl::StrFormat("%s:%d:%d", source, r.line, r.column);
    Receiver rec;
    const core::JsonValue* name = r.Find("name");
    const core::JsonValue* type = r.Find("type");
    if (name == nullptr || type == nullptr || name->type != core::JsonValue::Type::kString ||
        type->type != core::JsonValue::Type::kString) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": a receiver needs a name and a type"));
    }
    rec.name = name->string;
    if (type->string == "alertmanager") {
      rec.type = Receiver::Type::kAlertmanager;
    } else if (type->string == "pagerduty") {
      rec.type = Receiver::Type::kPagerDuty;
    } else if (type->string == "slack") {
      rec.type = Receiver::Type::kSlack;
    } else if (type->string == "webhook") {
      rec.type = Receiver::Type::kWebhook;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": type must be alertmanager, pagerduty, slack or webhook, not \"",
          type->string, "\""));
    }
    absl::StatusOr<std::string> url = Secret(r, "url", where);
    if (!url.ok()) return url.status();
    rec.url = *url;
    if (rec.url.empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": no url"));
    if (rec.type == Receiver::Type::kPagerDuty) {
      absl::StatusOr<std::string> key = Secret(r, "routing_key", where);
      if (!key.ok()) return key.status();
      if (key->empty()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": pagerduty needs a routing_key"));
      }
      rec.routing_key = *key;
    }
    c.receivers.push_back(std::move(rec));
  }
  return c;
}

absl::StatusOr<PagerConfig> LoadPagerConfig(const std::string& path) {
  absl::StatusOr<std::string> text = core::LocalFileSystem().ReadFile(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("pager config: ", text.status().message()));
  }
  return ParsePagerConfig(*text, path);
}

std::string PageUrl(const Receiver& r) {
  if (r.type == Receiver::Type::kAlertmanager) {
    return absl::StrCat(absl::StripSuffix(r.url, "/"), "/api/v2/alerts");
  }
  return r.url;
}

std::string PagePayload(const Receiver& r, const PageContent& c, int64_t now_ms) {
  const IncidentRow& i = c.incident;
  const std::string id = i.public_id();
  const std::string title =
      absl::StrFormat("[trainwatch] %s tier %d on %s: %s%s", id, i.tier, i.run_id,
                      StateText(i.state), i.observed ? absl::StrCat(" (", kObservedNotEnforced, ")") : "");
  switch (r.type) {
    case Receiver::Type::kAlertmanager: {
      // Alertmanager API v2: an array of alerts; endsAt in the past resolves.
      const bool resolved = c.event == "resolve";
      return absl::StrCat(
          "[{\"labels\":{\"alertname\":\"TrainwatchIncident\",\"run\":", Quote(i.run_id),
          ",\"incident\":", Quote(id), ",\"tier\":", Quote(std::to_string(i.tier)),
          ",\"severity\":",
          Quote(i.tier >= 3                                 ? "critical"
                : i.kind == core::EventKind::kStraggler ? "warning"
                                                            : "page"),
          "},\"annotations\":{\"summary\":", Quote(title), ",\"description\":", Quote(c.summary),
          ",\"approve_command\":", Quote(c.approve_command), ",\"dashboard\":",
          Quote(c.dashboard_url), ",\"state\":", Quote(StateText(i.state)),
          i.observed ? absl::StrCat(",\"observed\":", Quote(ObservedNote(i))) : std::string(),
          "},\"generatorURL\":", Quote(c.dashboard_url), ",\"startsAt\":",
          Quote(Iso8601(i.opened_ms)),
          resolved ? absl::StrCat(",\"endsAt\":", Quote(Iso8601(now_ms))) : std::string(), "}]");
    }
    case Receiver::Type::kPagerDuty: {
      const std::string action = c.event == "resolve" ? "resolve"
                                 : i.state == IncidentState::kRollingBack ? "acknowledge"
                                                                         : "trigger";
      return absl::StrCat(
          "{\"routing_key\":", Quote(r.routing_key), ",\"event_action\":", Quote(action),
          ",\"dedup_key\":", Quote(absl::StrCat("trainwatch-", i.run_id, "-", id)),
          ",\"payload\":{\"summary\":", Quote(title), ",\"source\":\"trainwatchd\",\"severity\":",
          Quote(i.tier >= 3                                 ? "critical"
                : i.kind == core::EventKind::kStraggler ? "warning"
                                                            : "error"), ",\"component\":", Quote(i.run_id),
          ",\"custom_details\":{\"incident\":", Quote(id), ",\"summary\":", Quote(c.summary),
          ",\"approve_command\":", Quote(c.approve_command), ",\"onset_step\":", i.onset_step,
          ",\"detection_step\":", i.detection_step, "}},\"links\":[{\"href\":",
          Quote(c.dashboard_url), ",\"text\":\"Grafana\"}]}");
    }
    case Receiver::Type::kSlack: {
      std::string text = absl::StrCat("*", title, "*\n", c.summary);
      if (!c.approve_command.empty()) absl::StrAppend(&text, "\nApprove: `", c.approve_command, "`");
      return absl::StrCat(
          "{\"text\":", Quote(title), ",\"blocks\":[{\"type\":\"section\",\"text\":{\"type\":"
          "\"mrkdwn\",\"text\":", Quote(text), "}},{\"type\":\"context\",\"elements\":[{\"type\":"
          "\"mrkdwn\",\"text\":", Quote(absl::StrCat("<", c.dashboard_url, "|Grafana: ", i.run_id,
                                                      ">")),
          "}]}]}");
    }
    case Receiver::Type::kWebhook:
      return absl::StrCat(
          "{\"event\":", Quote(c.event), ",\"incident_id\":", Quote(id), ",\"run_id\":",
          Quote(i.run_id), ",\"tier\":", i.tier, ",\"state\":", Quote(StateText(i.state)),
          ",\"title\":", Quote(i.title), ",\"summary\":", Quote(c.summary),
          ",\"onset_step\":", i.onset_step, ",\"detection_step\":", i.detection_step,
          ",\"recommended_checkpoint_step\":", i.recommended_checkpoint_step,
          ",\"approve_command\":", Quote(c.approve_command), ",\"dashboard_url\":",
          Quote(c.dashboard_url), ",\"time\":", Quote(Iso8601(now_ms)), "}");
  }
  return "{}";
}

Pager::Pager(Store* store, PagerConfig config, core::Clock* clock, HttpPoster* poster)
    : store_(store), config_(std::move(config)), clock_(clock), poster_(poster) {}

Pager::~Pager() { Stop(); }

std::vector<OutboxRow> Pager::Rows(const IncidentRow& incident, const std::string& summary,
                                   int64_t now_ms) const {
  std::vector<OutboxRow> rows;
  if (incident.tier < config_.min_tier || config_.receivers.empty()) return rows;
  PageContent c;
  c.incident = incident;
  const bool closed = incident.state == IncidentState::kResolved ||
                      incident.state == IncidentState::kDismissed;
  c.event = closed ? "resolve"
            : incident.state == IncidentState::kAwaitingDecision ? "trigger"
                                                                 : "update";
  c.summary = summary;
  // Without a checkpoint to roll back to, an approval would be refused:
  // the page suggests none (twctl incident show says what can be done).
  if (incident.state == IncidentState::kAwaitingDecision &&
      incident.recommended_checkpoint_step >= 0) {
    c.approve_command =
        absl::StrCat("twctl rollback approve ", incident.public_id(), " --to-step ",
                     incident.recommended_checkpoint_step, " --comment \"...\"");
  }
  if (!config_.grafana_url.empty()) {
    // The run's dashboard, from an hour before the incident to now.
    c.dashboard_url = absl::StrCat(config_.grafana_url,
                                   config_.grafana_url.find('?') == std::string::npos ? "?" : "&",
                                   "var-run=", incident.run_id, "&from=",
                                   incident.opened_ms - 3'600'000, "&to=now");
  }
  for (const Receiver& r : config_.receivers) {
    OutboxRow row;
    row.incident_id = incident.id;
    row.channel = r.name;
    row.kind = absl::StrCat(c.event, ":", StateText(incident.state));
    row.payload = PagePayload(r, c, now_ms);
    row.next_attempt_ms = now_ms;
    row.created_ms = now_ms;
    rows.push_back(std::move(row));
  }
  return rows;
}

void Pager::Start() {
  if (config_.receivers.empty()) return;
  thread_ = std::thread([this] { Loop(); });
}

void Pager::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void Pager::Wake() {
  absl::MutexLock lock(&mu_);
  wake_ = true;
}

absl::Status Pager::Post(const Receiver& r, const std::string& body) {
  absl::StatusOr<HttpResponse> response = poster_->Post(
      PageUrl(r), {{"Content-Type", "application/json"}}, body, absl::Seconds(10));
  if (!response.ok()) return response.status();
  if (response->status < 200 || response->status >= 300) {
    return absl::UnavailableError(absl::StrCat("HTTP ", response->status));
  }
  return absl::OkStatus();
}

void Pager::Loop() {
  int64_t last_resend = clock_->NowMs();
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || wake_; };
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(200));
      if (stop_) return;
      wake_ = false;
    }
    const int64_t now = clock_->NowMs();
    absl::StatusOr<std::vector<OutboxRow>> due = store_->DueOutbox(now, 100);
    if (!due.ok()) {
      LOG(ERROR) << "pager: reading the outbox: " << due.status();
      continue;
    }
    for (const OutboxRow& row : *due) {
      const Receiver* r = nullptr;
      for (const Receiver& x : config_.receivers) {
        if (x.name == row.channel) r = &x;
      }
      if (r == nullptr) continue;  // a receiver removed from the config
      const absl::Status posted = Post(*r, row.payload);
      const bool ok = posted.ok();
      const std::string error(posted.message());
      const int attempts = row.attempts + 1;
      const int64_t backoff =
          std::min<int64_t>(config_.max_backoff_ms, 1000LL << std::min(attempts - 1, 16));
      if (ok) {
        ++sent_;
      } else {
        ++failed_;
        LOG(WARNING) << "pager: " << r->name << " " << row.kind << " for I-" << row.incident_id
                     << " failed (" << error << "), attempt " << attempts;
      }
      absl::Status st = store_->MarkOutbox(row.id, ok, attempts, now + (ok ? 0 : backoff), error,
                                           now);
      if (!st.ok()) LOG(ERROR) << "pager: recording a delivery: " << st;
    }
    // Alertmanager forgets alerts that are not re-sent: re-post the last
    // firing page of every incident still open.
    if (now - last_resend >= config_.resend_ms) {
      last_resend = now;
      IncidentFilter f;
      f.open_only = true;
      f.tier = -1;
      f.limit = 1000;
      absl::StatusOr<std::vector<IncidentRow>> open = store_->ListIncidents(f);
      if (!open.ok()) continue;
      for (const IncidentRow& inc : *open) {
        if (inc.tier < config_.min_tier) continue;
        absl::StatusOr<std::vector<OutboxRow>> rows = store_->Outbox(inc.id);
        if (!rows.ok()) continue;
        for (const Receiver& r : config_.receivers) {
          if (r.type != Receiver::Type::kAlertmanager) continue;
          const OutboxRow* last = nullptr;
          for (const OutboxRow& o : *rows) {
            if (o.channel == r.name && o.state == "sent") last = &o;
          }
          if (last == nullptr) continue;
          if (absl::Status st = Post(r, last->payload); !st.ok()) {
            LOG(WARNING) << "pager: re-sending I-" << inc.id << " to " << r.name << ": "
                         << st.message();
          }
        }
      }
    }
  }
}

}  // namespace trainwatch::server
