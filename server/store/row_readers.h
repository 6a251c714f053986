// The store's rows read back into its types, the same for both backends:
// `Cursor` is SQLite's SqlStatement or PostgreSQL's Cells (pg_store.cc), a
// result row read by column position with Int, Real (NULL as NaN), Text,
// Blob, Bool and IsNull. The column lists and the shard columns' texts are
// shared too, so a column added to a table is read in one place.
#ifndef TRAINWATCH_SERVER_STORE_ROW_READERS_H_
#define TRAINWATCH_SERVER_STORE_ROW_READERS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "store/store.h"
#include "trainwatch/core/event.h"
#include "trainwatch/core/json.h"

namespace trainwatch::server::rows {

// A shards column: the ids joined by ';' ("3;7;9"; "" for none).
template <typename Cursor>
std::vector<uint64_t> ReadShards(const Cursor& q, int col) {
  std::vector<uint64_t> out;
  for (absl::string_view part : absl::StrSplit(q.Text(col), ';', absl::SkipEmpty())) {
    uint64_t v;
    if (absl::SimpleAtoi(part, &v)) out.push_back(v);
  }
  return out;
}

// A shard_names column: a JSON array of the names, NULL for none.
template <typename Cursor>
std::vector<std::string> ReadShardNames(const Cursor& q, int col) {
  std::vector<std::string> out;
  if (q.IsNull(col)) return out;
  absl::StatusOr<core::JsonValue> doc = core::ParseJson(q.Text(col), "shard_names");
  if (!doc.ok() || doc->type != core::JsonValue::Type::kArray) return out;
  for (const core::JsonValue& v : doc->array) {
    if (v.type == core::JsonValue::Type::kString) out.push_back(v.string);
  }
  return out;
}

// A step's columns after (run_id, attempt): the signals in Signal order,
// then the rest. Shared by the inserts, the attempt copies and every read.
inline constexpr char kStepColumns[] =
    "step, loss, grad_norm, log_z, nan_frac, lr, z_loss_alpha, activation_max, attention_p99, "
    "present, loss_ema_ratio, nonfinite, elements, decision, shards, missing_ranks, late, "
    "received_ms, shard_names, loss_scale, loss_scale_overflow";
// How many: a query selecting more after them reads those from this index.
inline constexpr int kStepColumnCount = 21;
static_assert(core::kNumSignals == 8, "kStepColumns names eight signals");

inline constexpr char kIncidentColumns[] =
    "id, run_id, episode, tier, state, kind, title, onset_step, detection_step, "
    "checkpoint_step, checkpoint_uri, shards, actions, opened_ms, updated_ms, closed_ms, "
    "shard_names, observed";

inline constexpr char kOutboxColumns[] =
    "id, incident_id, channel, kind, payload, state, attempts, next_attempt_ms, last_error, "
    "created_ms, sent_ms";

inline constexpr char kDecisionColumns[] =
    "id, incident_id, run_id, actor, kind, comment, payload, COALESCE(idempotency_key, ''), "
    "at_ms";

// A run with its rules: run_id, world_size, attempt, last_step, created_ms,
// last_seen_ms, incarnation, resume_step, observed, rules_json,
// rules_source and attachment (each backend's SELECT: the NULL-to-''
// function differs).
template <typename Cursor>
RunRow ReadRun(const Cursor& r) {
  RunRow row;
  row.run_id = r.Text(0);
  row.world_size = static_cast<int32_t>(r.Int(1));
  row.attempt = r.Int(2);
  row.last_step = r.Int(3);
  row.created_ms = r.Int(4);
  row.last_seen_ms = r.Int(5);
  row.incarnation = r.Text(6);
  if (!r.IsNull(7)) row.resume_step = r.Int(7);
  row.observed = r.Bool(8);
  row.rules_json = r.Text(9);
  row.rules_source = r.Text(10);
  row.attachment = r.Text(11);
  return row;
}

// One rank's report of a step: rank, step, report.
template <typename Cursor>
RankStepRow ReadRankStep(const Cursor& r, const std::string& run_id, int64_t attempt) {
  RankStepRow row;
  row.run_id = run_id;
  row.attempt = attempt;
  row.rank = static_cast<int32_t>(r.Int(0));
  row.step = r.Int(1);
  row.report = r.Blob(2);
  return row;
}

inline constexpr char kEventColumns[] =
    "run_id, episode, step, onset_step, tier, action, kind, reason, shards, checkpoint_step, "
    "created_ms";

template <typename Cursor>
EventRow ReadEvent(const Cursor& q, int64_t incident_id) {
  EventRow r;
  r.run_id = q.Text(0);
  r.incident_id = incident_id;
  r.event.episode = static_cast<uint64_t>(q.Int(1));
  r.event.step = q.Int(2);
  r.event.onset_step = q.Int(3);
  r.event.tier = static_cast<int>(q.Int(4));
  r.event.action = static_cast<core::Action>(q.Int(5));
  r.event.kind = static_cast<core::EventKind>(q.Int(6));
  r.event.reason = q.Text(7);
  r.event.shards = ReadShards(q, 8);
  r.event.recommended_checkpoint_step = q.Int(9);
  r.created_ms = q.Int(10);
  return r;
}

template <typename Cursor>
StepRow ReadStep(const Cursor& q) {
  StepRow s;
  s.step = q.Int(0);
  const auto present = static_cast<uint32_t>(q.Int(9));
  for (int i = 0; i < core::kNumSignals; ++i) {
    // A reported NaN may be stored as NULL and comes back as NaN; presence
    // says whether it was reported.
    const auto signal = static_cast<core::Signal>(i);
    if (present & core::Bit(signal)) s.Set(signal, q.Real(1 + i));
  }
  s.loss_ema_ratio = q.Real(10);
  if (!q.IsNull(12)) {  // NULL: no counts
    s.nonfinite = static_cast<uint64_t>(q.Int(11));
    s.elements = static_cast<uint64_t>(q.Int(12));
  }
  s.decision = static_cast<int>(q.Int(13));
  s.shards = ReadShards(q, 14);
  s.missing_ranks = q.Text(15);
  s.late = q.Bool(16);
  s.received_ms = q.Int(17);
  s.shard_names = ReadShardNames(q, 18);
  // The flag's NULL says "no loss scale"; the scale's may be a NaN's.
  if (!q.IsNull(20)) s.SetLossScale(q.Real(19), q.Bool(20));
  return s;
}

// The recommended actions are stored as the JSON replay prints; a column
// that does not parse whole fails the read (`error`) rather than giving half
// a recommendation.
template <typename Cursor>
IncidentRow ReadIncident(const Cursor& q, absl::Status* error) {
  IncidentRow r;
  r.id = q.Int(0);
  r.run_id = q.Text(1);
  r.episode = static_cast<uint64_t>(q.Int(2));
  r.tier = static_cast<int>(q.Int(3));
  r.state = static_cast<IncidentState>(q.Int(4));
  r.kind = static_cast<core::EventKind>(q.Int(5));
  r.title = q.Text(6);
  r.onset_step = q.Int(7);
  r.detection_step = q.Int(8);
  r.recommended_checkpoint_step = q.Int(9);
  r.recommended_checkpoint_uri = q.Text(10);
  r.shards = ReadShards(q, 11);
  absl::StatusOr<std::vector<core::RecommendedAction>> actions = core::ParseRecommendedActionsJson(
      q.Text(12), absl::StrCat("actions of incident I-", r.id));
  if (actions.ok()) {
    r.actions = *std::move(actions);
  } else if (error->ok()) {
    *error = absl::DataLossError(actions.status().message());
  }
  r.opened_ms = q.Int(13);
  r.updated_ms = q.Int(14);
  r.closed_ms = q.Int(15);
  r.shard_names = ReadShardNames(q, 16);
  r.observed = q.Bool(17);
  return r;
}

template <typename Cursor>
OutboxRow ReadOutbox(const Cursor& q) {
  OutboxRow o;
  o.id = q.Int(0);
  o.incident_id = q.Int(1);
  o.channel = q.Text(2);
  o.kind = q.Text(3);
  o.payload = q.Blob(4);
  o.state = q.Text(5);
  o.attempts = static_cast<int>(q.Int(6));
  o.next_attempt_ms = q.Int(7);
  o.last_error = q.Text(8);
  o.created_ms = q.Int(9);
  o.sent_ms = q.Int(10);
  return o;
}

template <typename Cursor>
DecisionRow ReadDecision(const Cursor& q) {
  DecisionRow d;
  d.id = q.Int(0);
  d.incident_id = q.Int(1);
  d.run_id = q.Text(2);
  d.actor = q.Text(3);
  d.kind = q.Text(4);
  d.comment = q.Text(5);
  d.payload = q.Blob(6);
  d.idempotency_key = q.Text(7);
  d.at_ms = q.Int(8);
  return d;
}

// A quarantine entry of `run_id`: first_shard, last_shard, incident_id,
// decision_id, created_ms, name.
template <typename Cursor>
QuarantineRow ReadQuarantine(const Cursor& r, const std::string& run_id) {
  return QuarantineRow{run_id,
                       static_cast<uint64_t>(r.Int(0)),
                       static_cast<uint64_t>(r.Int(1)),
                       r.Int(2),
                       r.Int(3),
                       r.Int(4),
                       r.IsNull(5) ? std::string() : r.Text(5)};
}

}  // namespace trainwatch::server::rows

#endif  // TRAINWATCH_SERVER_STORE_ROW_READERS_H_
