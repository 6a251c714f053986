#include "store/pg/pg_store.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "store/pg/pg_migrations.h"
#include "store/pg/shard_leases.h"
#include "store/row_readers.h"
#include "trainwatch/core/event.h"
#include "trainwatch/core/json.h"

namespace trainwatch::server {

namespace {

using rows::kDecisionColumns;
using rows::kIncidentColumns;
using rows::kOutboxColumns;
using rows::kStepColumnCount;
using rows::kStepColumns;
using rows::ReadDecision;
using rows::ReadIncident;
using rows::ReadOutbox;
using rows::ReadStep;

// Phase 1 (active/standby): a writer owns every shard, and a batch's rows
// (runs, incidents, the outbox) are checked against all of them.
std::vector<int> AllShards(const ShardLeases& leases) {
  std::vector<int> all(static_cast<size_t>(leases.shards()));
  for (int s = 0; s < leases.shards(); ++s) all[static_cast<size_t>(s)] = s;
  return all;
}

using Params = std::vector<PgParam>;

// ---- values to and from PostgreSQL's text format

// bytea in its hex input format: serialized messages hold any byte.
PgParam Bytes(absl::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "\\x";
  out.reserve(2 + 2 * bytes.size());
  for (unsigned char c : bytes) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return PgParam(out);
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

PgParam Bool(bool v) { return PgParam(v ? "true" : "false"); }

// The same texts as the SQLite backend's (sql_statement.h): "3;7;9", and a
// JSON array of names, NULL when there are none.
PgParam ShardsText(const std::vector<uint64_t>& shards) {
  return PgParam(absl::StrJoin(shards, ";"));
}

PgParam ShardNamesText(const std::vector<std::string>& names) {
  if (names.empty()) return PgParam();
  std::string json;
  core::AppendJsonStrings(&json, names);
  return PgParam(json);
}

PgParam OrNull(bool present, PgParam value) { return present ? value : PgParam(); }

// Text an agent chose freely (a command acknowledgement's message and id):
// PostgreSQL's text holds no NUL byte, which valid UTF-8 may carry, and a
// batch failing on one would fail at every retry, every run's records in it
// with it. A NUL is stored as U+FFFD instead.
PgParam AgentText(absl::string_view text) {
  if (text.find('\0') == absl::string_view::npos) return PgParam(text);
  return PgParam(absl::StrReplaceAll(text, {{absl::string_view("\0", 1), "\xef\xbf\xbd"}}));
}

// One row of a result, read by column.
class Cells {
 public:
  Cells(const PgRows& rows, int row) : rows_(rows), row_(row) {}

  bool IsNull(int col) const { return rows_.IsNull(row_, col); }
  int64_t Int(int col) const { return rows_.Int(row_, col).value_or(0); }
  std::string Text(int col) const { return rows_.Text(row_, col); }
  // NULL reads as NaN, as in the SQLite backend.
  double Real(int col) const {
    double v = std::numeric_limits<double>::quiet_NaN();
    if (!IsNull(col) && !absl::SimpleAtod(Text(col), &v)) {
      v = std::numeric_limits<double>::quiet_NaN();
    }
    return v;
  }
  bool Bool(int col) const {
    const std::string t = Text(col);
    return t == "t" || t == "true";
  }
  // bytea arrives hex-encoded ("\x0a1b").
  std::string Blob(int col) const {
    const std::string t = Text(col);
    std::string out;
    if (t.size() < 2 || t[0] != '\\' || t[1] != 'x') return out;
    out.reserve((t.size() - 2) / 2);
    for (size_t i = 2; i + 1 < t.size(); i += 2) {
      const int hi = HexDigit(t[i]);
      const int lo = HexDigit(t[i + 1]);
      if (hi < 0 || lo < 0) break;
      out.push_back(static_cast<char>(hi * 16 + lo));
    }
    return out;
  }
  std::vector<uint64_t> Shards(int col) const {
    std::vector<uint64_t> out;
    for (absl::string_view part : absl::StrSplit(Text(col), ';', absl::SkipEmpty())) {
      uint64_t v;
      if (absl::SimpleAtoi(part, &v)) out.push_back(v);
    }
    return out;
  }
  std::vector<std::string> ShardNames(int col) const {
    std::vector<std::string> out;
    if (IsNull(col)) return out;
    absl::StatusOr<core::JsonValue> doc = core::ParseJson(Text(col), "shard_names");
    if (!doc.ok() || doc->type != core::JsonValue::Type::kArray) return out;
    for (const core::JsonValue& v : doc->array) {
      if (v.type == core::JsonValue::Type::kString) out.push_back(v.string);
    }
    return out;
  }

 private:
  const PgRows& rows_;
  int row_;
};

// Runs a query and makes a value of each row with read(Cells).
template <typename Read>
auto Query(PgConnection& c, absl::string_view sql, const Params& params, Read read)
    -> absl::StatusOr<std::vector<decltype(read(std::declval<const Cells&>()))>> {
  absl::StatusOr<PgRows> rows = c.Execute(sql, params);
  if (!rows.ok()) return rows.status();
  std::vector<decltype(read(std::declval<const Cells&>()))> out;
  out.reserve(static_cast<size_t>(rows->rows()));
  for (int i = 0; i < rows->rows(); ++i) out.push_back(read(Cells(*rows, i)));
  return out;
}

template <typename Read>
auto QueryFirst(PgConnection& c, absl::string_view sql, const Params& params, Read read)
    -> absl::StatusOr<std::optional<decltype(read(std::declval<const Cells&>()))>> {
  absl::StatusOr<PgRows> rows = c.Execute(sql, params);
  if (!rows.ok()) return rows.status();
  if (rows->rows() == 0) return std::nullopt;
  return read(Cells(*rows, 0));
}

absl::StatusOr<int64_t> QueryInt(PgConnection& c, absl::string_view sql, const Params& params) {
  absl::StatusOr<PgRows> rows = c.Execute(sql, params);
  if (!rows.ok()) return rows.status();
  if (rows->rows() == 0) return 0;
  return rows->Int(0, 0).value_or(0);
}

absl::Status Run(PgConnection& c, absl::string_view sql, const Params& params) {
  return c.Execute(sql, params).status();
}

// Appends one element to a PostgreSQL array literal: quoted, so that any
// text (commas, braces, quotes, a bytea's backslash) stays one element.
void AppendArrayElement(std::string* array, const PgParam& value) {
  if (array->size() > 1) array->push_back(',');
  if (value.is_null()) {
    array->append("NULL");
    return;
  }
  array->push_back('"');
  for (char ch : value.text()) {
    if (ch == '"' || ch == '\\') array->push_back('\\');
    array->push_back(ch);
  }
  array->push_back('"');
}

// Inserts `rows` in statements of up to kRowsPerStatement: `head` is the
// INSERT up to its column list, `types` the type of each column, and
// fill(row, &params) appends a row's values. Each column goes as one array
// parameter, and the rows come out of unnest() in the batch's order: a
// statement of a few parameters, where a VALUES list of one placeholder per
// value cost PostgreSQL more to parse and plan than the rows' inserts
// (../shared/HA.md measured unnest ahead of multi-row VALUES too).
template <typename Row, typename Fill>
absl::Status InsertRows(PgConnection& c, absl::string_view head,
                        const std::vector<const char*>& types, const std::vector<Row>& rows,
                        Fill fill, absl::string_view tail) {
  constexpr size_t kRowsPerStatement = 5000;
  const size_t width = types.size();
  std::string sql = absl::StrCat(head, " SELECT * FROM unnest(");
  for (size_t k = 0; k < width; ++k) {
    absl::StrAppend(&sql, k == 0 ? "" : ", ", "$", k + 1, "::", types[k], "[]");
  }
  absl::StrAppend(&sql, ")", tail.empty() ? "" : " ", tail);
  Params row;
  std::vector<std::string> arrays(width);
  for (size_t first = 0; first < rows.size(); first += kRowsPerStatement) {
    const size_t n = std::min(kRowsPerStatement, rows.size() - first);
    for (std::string& a : arrays) a.assign("{");
    for (size_t r = 0; r < n; ++r) {
      row.clear();
      fill(rows[first + r], &row);
      for (size_t k = 0; k < width; ++k) AppendArrayElement(&arrays[k], row[k]);
    }
    Params params;
    params.reserve(width);
    for (std::string& a : arrays) params.emplace_back(a + "}");
    if (absl::Status s = Run(c, sql, params); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// ---- runs, steps, rank steps, checkpoints, attempts, incarnations

// The step's columns after (run_id, attempt), as in the SQLite backend: the
// signals in Signal order, then the rest.


absl::Status UpsertRuns(PgConnection& c, const std::vector<RunRow>& runs) {
  // One statement a row: DO UPDATE may not touch a row twice in one
  // statement, and a batch may carry a run twice.
  for (const RunRow& r : runs) {
    absl::Status s = Run(
        c,
        "INSERT INTO runs (run_id, world_size, attempt, last_step, created_ms, last_seen_ms, "
        "incarnation, resume_step, observed) VALUES ($1::text, $2::integer, $3::bigint, "
        "$4::bigint, $5::bigint, $6::bigint, $7::text, $8::bigint, $9::boolean) "
        "ON CONFLICT (run_id) DO UPDATE SET world_size = excluded.world_size, "
        "attempt = excluded.attempt, last_step = excluded.last_step, "
        "last_seen_ms = excluded.last_seen_ms, incarnation = excluded.incarnation, "
        "resume_step = excluded.resume_step, observed = excluded.observed",
        {r.run_id, r.world_size, r.attempt, r.last_step, r.created_ms, r.last_seen_ms,
         r.incarnation, OrNull(r.resume_step.has_value(), r.resume_step.value_or(0)),
         Bool(r.observed)});
    if (!s.ok()) return s;
    // The rules change once or twice in a run's life: an unchanged row is
    // compared, never rewritten (as the SQLite backend's migration 11).
    s = Run(c,
            "INSERT INTO run_rules (run_id, rules_json, rules_source) VALUES ($1::text, $2::text, "
            "$3::text) ON CONFLICT (run_id) DO UPDATE SET rules_json = excluded.rules_json, "
            "rules_source = excluded.rules_source WHERE run_rules.rules_json <> "
            "excluded.rules_json OR run_rules.rules_source <> excluded.rules_source",
            {r.run_id, r.rules_json, r.rules_source});
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<RunRow>> Runs(PgConnection& c) {
  return Query(c,
               "SELECT runs.run_id, world_size, attempt, last_step, created_ms, last_seen_ms, "
               "incarnation, resume_step, observed, COALESCE(rules_json, ''), "
               "COALESCE(rules_source, '') FROM runs LEFT JOIN run_rules USING (run_id) "
               "ORDER BY runs.run_id",
               {}, rows::ReadRun<Cells>);
}

absl::Status InsertSteps(PgConnection& c, const std::vector<WriteBatch::Step>& steps) {
  static const std::vector<const char*> kTypes = {
      "text",   "bigint", "bigint", "float8", "float8", "float8", "float8",  "float8",
      "float8", "float8", "float8", "integer", "float8", "bigint", "bigint", "integer",
      "text",   "text",   "boolean", "bigint", "text",  "float8", "boolean"};
  return InsertRows(
      c, absl::StrCat("INSERT INTO steps (run_id, attempt, ", kStepColumns, ")"), kTypes,
      steps,
      [](const WriteBatch::Step& w, Params* p) {
        const StepRow& s = w.step;
        p->emplace_back(w.run_id);
        p->emplace_back(w.attempt);
        p->emplace_back(s.step);
        for (int i = 0; i < core::kNumSignals; ++i) {
          const auto signal = static_cast<core::Signal>(i);
          p->push_back(OrNull(s.Has(signal), s.Get(signal)));
        }
        p->emplace_back(int64_t{s.present()});
        p->emplace_back(s.loss_ema_ratio);
        p->push_back(OrNull(s.has_counts(), static_cast<int64_t>(s.nonfinite)));
        p->push_back(OrNull(s.has_counts(), static_cast<int64_t>(s.elements)));
        p->emplace_back(s.decision);
        p->push_back(ShardsText(s.shards));
        p->emplace_back(s.missing_ranks);
        p->push_back(Bool(s.late));
        p->emplace_back(s.received_ms);
        p->push_back(ShardNamesText(s.shard_names));
        p->push_back(OrNull(s.HasLossScale(), s.loss_scale()));
        p->push_back(s.HasLossScale() ? Bool(s.loss_scale_overflow()) : PgParam());
      },
      // A repeated step is ignored, the first write wins, as in SQLite's
      // INSERT OR IGNORE; so is one repeated within the statement.
      "ON CONFLICT DO NOTHING");
}

absl::Status CopyAttempts(PgConnection& c, const std::vector<AttemptCopy>& copies) {
  for (const AttemptCopy& a : copies) {
    absl::Status s =
        Run(c,
            absl::StrCat("INSERT INTO steps (run_id, attempt, ", kStepColumns,
                         ") SELECT run_id, $2::bigint, ", kStepColumns,
                         " FROM steps WHERE run_id = $1::text AND attempt = $3::bigint AND "
                         "step <= $4::bigint ON CONFLICT DO NOTHING"),
            {a.run_id, a.to_attempt, a.from_attempt, a.up_to_step});
    if (!s.ok()) return s;
    s = Run(c,
            "INSERT INTO attempts (run_id, attempt, start, incident_id, incarnation, from_step, "
            "started_ms) VALUES ($1::text, $2::bigint, $3::integer, $4::bigint, $5::text, "
            "$6::bigint, $7::bigint) ON CONFLICT DO NOTHING",
            {a.run_id, a.to_attempt, static_cast<int>(a.start), a.incident_id, a.incarnation,
             a.up_to_step, a.started_ms});
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<AttemptRow>> Attempts(PgConnection& c, const std::string& run_id,
                                                 int64_t current) {
  std::vector<AttemptRow> out(static_cast<size_t>(std::max<int64_t>(current, 0)) + 1);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].attempt = static_cast<int64_t>(i);
    out[i].start = i == 0 ? AttemptStart::kFirst : AttemptStart::kRollback;
  }
  absl::StatusOr<PgRows> how = c.Execute(
      "SELECT attempt, start, incident_id, incarnation, from_step, started_ms FROM attempts "
      "WHERE run_id = $1::text AND attempt >= 0 AND attempt <= $2::bigint",
      {run_id, current});
  if (!how.ok()) return how.status();
  for (int i = 0; i < how->rows(); ++i) {
    const Cells r(*how, i);
    AttemptRow& a = out[static_cast<size_t>(r.Int(0))];
    a.start = static_cast<AttemptStart>(r.Int(1));
    a.incident_id = r.Int(2);
    a.incarnation = r.Text(3);
    a.from_step = r.Int(4);
    a.started_ms = r.Int(5);
  }
  absl::StatusOr<PgRows> range = c.Execute(
      "SELECT attempt, MIN(step), MAX(step) FROM steps WHERE run_id = $1::text AND "
      "attempt >= 0 AND attempt <= $2::bigint GROUP BY attempt",
      {run_id, current});
  if (!range.ok()) return range.status();
  for (int i = 0; i < range->rows(); ++i) {
    const Cells r(*range, i);
    AttemptRow& a = out[static_cast<size_t>(r.Int(0))];
    a.first_step = r.Int(1);
    a.last_step = r.Int(2);
  }
  return out;
}

absl::Status InsertIncarnations(PgConnection& c, const std::vector<IncarnationRow>& rows) {
  return InsertRows(
      c, "INSERT INTO incarnations (run_id, incarnation, seen_ms)",
      {"text", "text", "bigint"}, rows,
      [](const IncarnationRow& r, Params* p) {
        p->emplace_back(r.run_id);
        p->emplace_back(r.incarnation);
        p->emplace_back(r.seen_ms);
      },
      "ON CONFLICT DO NOTHING");
}

absl::Status InsertRankSteps(PgConnection& c, const std::vector<RankStepRow>& rows) {
  return InsertRows(
      c, "INSERT INTO rank_steps (run_id, attempt, rank, step, report)",
      {"text", "bigint", "integer", "bigint", "bytea"}, rows,
      [](const RankStepRow& r, Params* p) {
        p->emplace_back(r.run_id);
        p->emplace_back(r.attempt);
        p->emplace_back(r.rank);
        p->emplace_back(r.step);
        p->push_back(Bytes(r.report));
      },
      "ON CONFLICT DO NOTHING");
}

absl::StatusOr<std::vector<RankStepRow>> SelectRankSteps(PgConnection& c,
                                                         const std::string& run_id,
                                                         int64_t attempt, absl::string_view op,
                                                         int64_t step) {
  return Query(c,
               absl::StrCat("SELECT rank, step, report FROM rank_steps WHERE run_id = $1::text "
                            "AND attempt = $2::bigint AND step ",
                            op, " $3::bigint ORDER BY step, rank"),
               {run_id, attempt, step},
               [&](const Cells& r) { return rows::ReadRankStep(r, run_id, attempt); });
}

absl::Status UpsertCheckpoints(PgConnection& c, const std::vector<CheckpointRow>& rows) {
  for (const CheckpointRow& r : rows) {
    absl::Status s = Run(c,
                         "INSERT INTO checkpoints (run_id, step, uri, reported_ms) VALUES "
                         "($1::text, $2::bigint, $3::text, $4::bigint) ON CONFLICT (run_id, step) "
                         "DO UPDATE SET uri = excluded.uri, reported_ms = excluded.reported_ms",
                         {r.run_id, r.step, r.uri, r.reported_ms});
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// ---- incidents, events, flagged shards



absl::Status UpsertIncidents(PgConnection& c, const std::vector<IncidentRow>& incidents) {
  for (const IncidentRow& r : incidents) {
    std::string actions;
    core::AppendRecommendedActionsJson(&actions, r.actions);
    // The whole row is replaced, as SQLite's INSERT OR REPLACE does.
    absl::Status s = Run(
        c,
        absl::StrCat(
            "INSERT INTO incidents (", kIncidentColumns,
            ") VALUES ($1::bigint, $2::text, $3::bigint, $4::integer, $5::integer, $6::integer, "
            "$7::text, $8::bigint, $9::bigint, $10::bigint, $11::text, $12::text, $13::text, "
            "$14::bigint, $15::bigint, $16::bigint, $17::text, $18::boolean) "
            "ON CONFLICT (id) DO UPDATE SET run_id = excluded.run_id, "
            "episode = excluded.episode, tier = excluded.tier, state = excluded.state, "
            "kind = excluded.kind, title = excluded.title, onset_step = excluded.onset_step, "
            "detection_step = excluded.detection_step, "
            "checkpoint_step = excluded.checkpoint_step, checkpoint_uri = excluded.checkpoint_uri, "
            "shards = excluded.shards, actions = excluded.actions, opened_ms = excluded.opened_ms, "
            "updated_ms = excluded.updated_ms, closed_ms = excluded.closed_ms, "
            "shard_names = excluded.shard_names, observed = excluded.observed"),
        {r.id, r.run_id, static_cast<int64_t>(r.episode), r.tier, static_cast<int>(r.state),
         static_cast<int>(r.kind), r.title, r.onset_step, r.detection_step,
         r.recommended_checkpoint_step, r.recommended_checkpoint_uri, ShardsText(r.shards),
         actions, r.opened_ms, r.updated_ms, r.closed_ms, ShardNamesText(r.shard_names),
         Bool(r.observed)});
    if (!s.ok()) return s;
    if (r.shards.empty()) continue;
    // Shard ids are uint64 stored as their int64 bits, as in SQLite.
    std::vector<int64_t> ids(r.shards.begin(), r.shards.end());
    s = Run(c,
            "INSERT INTO flagged_shards (run_id, shard, incident_id) "
            "SELECT $1::text, unnest($2::bigint[]), $3::bigint ON CONFLICT DO NOTHING",
            {r.run_id, absl::StrCat("{", absl::StrJoin(ids, ","), "}"), r.id});
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status InsertEvents(PgConnection& c, const std::vector<EventRow>& events) {
  return InsertRows(
      c,
      "INSERT INTO events (run_id, incident_id, episode, step, onset_step, tier, action, kind, "
      "reason, shards, checkpoint_step, created_ms)",
      {"text", "bigint", "bigint", "bigint", "bigint", "integer", "integer", "integer", "text",
       "text", "bigint", "bigint"},
      events,
      [](const EventRow& r, Params* p) {
        const core::Event& e = r.event;
        p->emplace_back(r.run_id);
        p->emplace_back(r.incident_id);
        p->emplace_back(static_cast<int64_t>(e.episode));
        p->emplace_back(e.step);
        p->emplace_back(e.onset_step);
        p->emplace_back(e.tier);
        p->emplace_back(static_cast<int>(e.action));
        p->emplace_back(static_cast<int>(e.kind));
        p->emplace_back(e.reason);
        p->push_back(ShardsText(e.shards));
        p->emplace_back(e.recommended_checkpoint_step);
        p->emplace_back(r.created_ms);
      },
      "");
}

// ---- decisions, commands, acknowledgements, quarantines



absl::Status InsertDecisions(PgConnection& c, const std::vector<DecisionRow>& decisions) {
  // No conflict clause: a repeated id or idempotency key fails the batch, as
  // in SQLite.
  return InsertRows(
      c,
      "INSERT INTO decisions (id, incident_id, run_id, actor, kind, comment, payload, "
      "idempotency_key, at_ms)",
      {"bigint", "bigint", "text", "text", "text", "text", "bytea", "text", "bigint"}, decisions,
      [](const DecisionRow& d, Params* p) {
        p->emplace_back(d.id);
        p->emplace_back(d.incident_id);
        p->emplace_back(d.run_id);
        p->emplace_back(d.actor);
        p->emplace_back(d.kind);
        p->emplace_back(d.comment);
        p->push_back(Bytes(d.payload));
        // NULL, not '': UNIQUE lets any number of NULLs through.
        p->push_back(OrNull(!d.idempotency_key.empty(), d.idempotency_key));
        p->emplace_back(d.at_ms);
      },
      "");
}

absl::Status InsertCommands(PgConnection& c, const std::vector<CommandRow>& commands) {
  return InsertRows(
      c, "INSERT INTO commands (id, run_id, incident_id, kind, payload, created_ms)",
      {"text", "text", "bigint", "text", "bytea", "bigint"}, commands,
      [](const CommandRow& r, Params* p) {
        p->emplace_back(r.id);
        p->emplace_back(r.run_id);
        p->emplace_back(r.incident_id);
        p->emplace_back(r.kind);
        p->push_back(Bytes(r.payload));
        p->emplace_back(r.created_ms);
      },
      "ON CONFLICT DO NOTHING");
}

absl::Status InsertCommandAcks(PgConnection& c, const std::vector<CommandAckRow>& acks) {
  return InsertRows(
      c,
      "INSERT INTO command_acks (command_id, run_id, rank, status, message, resumed_step, "
      "at_ms)",
      {"text", "text", "integer", "integer", "text", "bigint", "bigint"}, acks,
      [](const CommandAckRow& a, Params* p) {
        p->push_back(AgentText(a.command_id));
        p->emplace_back(a.run_id);
        p->emplace_back(a.rank);
        p->emplace_back(a.status);
        p->push_back(AgentText(a.message));
        p->emplace_back(a.resumed_step);
        p->emplace_back(a.at_ms);
      },
      "ON CONFLICT DO NOTHING");
}

absl::Status InsertQuarantines(PgConnection& c, const std::vector<QuarantineRow>& rows) {
  return InsertRows(
      c,
      "INSERT INTO quarantined_shards (run_id, first_shard, last_shard, incident_id, "
      "decision_id, created_ms, name)",
      {"text", "bigint", "bigint", "bigint", "bigint", "bigint", "text"}, rows,
      [](const QuarantineRow& r, Params* p) {
        p->emplace_back(r.run_id);
        p->emplace_back(static_cast<int64_t>(r.first));
        p->emplace_back(static_cast<int64_t>(r.last));
        p->emplace_back(r.incident_id);
        p->emplace_back(r.decision_id);
        p->emplace_back(r.created_ms);
        p->push_back(OrNull(!r.name.empty(), r.name));  // NULL for a range
      },
      "");
}

// ---- the outbox and engine snapshots



absl::Status InsertOutbox(PgConnection& c, const std::vector<OutboxRow>& pages) {
  // Ids in the batch's order: the identity numbers unnest()'s rows in their
  // order, and pages are delivered by id.
  return InsertRows(
      c,
      "INSERT INTO outbox (incident_id, channel, kind, payload, state, attempts, "
      "next_attempt_ms, created_ms)",
      {"bigint", "text", "text", "bytea", "text", "integer", "bigint", "bigint"}, pages,
      [](const OutboxRow& o, Params* p) {
        p->emplace_back(o.incident_id);
        p->emplace_back(o.channel);
        p->emplace_back(o.kind);
        p->push_back(Bytes(o.payload));
        p->emplace_back("pending");
        p->emplace_back(0);
        p->emplace_back(o.next_attempt_ms);
        p->emplace_back(o.created_ms);
      },
      "ON CONFLICT DO NOTHING");
}

absl::Status InsertEngineSnapshots(PgConnection& c, const std::vector<EngineSnapshotRow>& rows,
                                   int kept) {
  for (const EngineSnapshotRow& r : rows) {
    absl::Status s = Run(
        c,
        "INSERT INTO engine_snapshots (run_id, attempt, step, skipped, overflows, written_ms, "
        "state) VALUES ($1::text, $2::bigint, $3::bigint, $4::bigint, $5::bigint, $6::bigint, "
        "$7::bytea) ON CONFLICT (run_id, attempt, step) DO UPDATE SET skipped = excluded.skipped, "
        "overflows = excluded.overflows, written_ms = excluded.written_ms, state = excluded.state",
        {r.run_id, r.attempt, r.step, r.skipped, r.overflows, r.written_ms, Bytes(r.state)});
    if (!s.ok()) return s;
    // Older snapshots serve a rebuild to an earlier step; beyond a few they
    // only cost space.
    s = Run(c,
            "DELETE FROM engine_snapshots WHERE run_id = $1::text AND attempt = $2::bigint AND "
            "step < (SELECT MIN(step) FROM (SELECT step FROM engine_snapshots WHERE "
            "run_id = $1::text AND attempt = $2::bigint ORDER BY step DESC LIMIT $3::bigint) k)",
            {r.run_id, r.attempt, kept});
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// The whole batch, in the order the SQLite backend writes it: the steps
// before the attempt copies, so a copy also takes the old attempt's steps
// still in this batch.
absl::Status WriteTables(PgConnection& c, const WriteBatch& b, int kept) {
  absl::Status s;
  auto write = [&](const auto& table, auto fn) {
    if (s.ok() && !table.empty()) s = fn(c, table);
  };
  write(b.runs, UpsertRuns);
  write(b.steps, InsertSteps);
  write(b.rank_steps, InsertRankSteps);
  write(b.checkpoints, UpsertCheckpoints);
  write(b.incidents, UpsertIncidents);
  write(b.events, InsertEvents);
  write(b.command_acks, InsertCommandAcks);
  write(b.attempt_copies, CopyAttempts);
  write(b.incarnations, InsertIncarnations);
  write(b.decisions, InsertDecisions);
  write(b.commands, InsertCommands);
  write(b.quarantines, InsertQuarantines);
  write(b.outbox, InsertOutbox);
  write(b.engine_snapshots, [kept](PgConnection& conn, const std::vector<EngineSnapshotRow>& t) {
    return InsertEngineSnapshots(conn, t, kept);
  });
  return s;
}

const absl::Status& StatusOf(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}

// Runs fn on *conn, connecting first when there is none. A connection that
// failed as unavailable (lost, or a commit refused under the ack rule) is
// dropped, and the next call connects again: to the same server after it
// restarted, or, with a multi-host conninfo, to whichever is the primary.
template <typename Fn>
auto WithConnection(std::unique_ptr<PgConnection>& conn, const std::string& conninfo,
                    PgCommitCounters* counters, Fn fn)
    -> decltype(fn(std::declval<PgConnection&>())) {
  if (conn == nullptr) {
    absl::StatusOr<std::unique_ptr<PgConnection>> c = PgConnection::Connect(conninfo, counters);
    if (!c.ok()) return c.status();
    conn = *std::move(c);
  }
  auto result = fn(*conn);
  if (StatusOf(result).code() == absl::StatusCode::kUnavailable) conn.reset();
  return result;
}

// ForEachStep reads the history this many steps at a time: a long run's
// whole history would otherwise be one result in memory.
constexpr int64_t kStepsPerRead = 10000;

}  // namespace

template <typename Fn>
auto PgStore::OnWriter(Fn fn) -> decltype(fn(std::declval<PgConnection&>())) {
  return WithConnection(writer_, conninfo_, &counters_, std::move(fn));
}

template <typename Fn>
auto PgStore::OnReader(Fn fn) -> decltype(fn(std::declval<PgConnection&>())) {
  absl::MutexLock lock(&read_mu_);
  return WithConnection(reader_, conninfo_, &counters_, std::move(fn));
}

absl::StatusOr<std::unique_ptr<PgStore>> PgStore::Open(const std::string& conninfo,
                                                       const StoreOptions& options) {
  if (options.engine_snapshots_kept < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "engine snapshots kept must be >= 1, got ", options.engine_snapshots_kept));
  }
  if (options.max_bytes != 0) {
    return absl::InvalidArgumentError(
        "a database quota (--db_max_bytes) applies to SQLite only: PostgreSQL's quotas are its "
        "server's");
  }
  if (options.synchronous != StoreOptions::Synchronous::kFull) {
    return absl::InvalidArgumentError(
        "--db_synchronous normal applies to SQLite only: with PostgreSQL, what a commit waits "
        "for is the server's synchronous_commit");
  }
  std::unique_ptr<PgStore> store(
      new PgStore(conninfo, options.engine_snapshots_kept, options.fence));
  absl::StatusOr<std::unique_ptr<PgConnection>> writer =
      PgConnection::Connect(conninfo, &store->counters_);
  if (!writer.ok()) return writer.status();
  store->writer_ = *std::move(writer);
  absl::StatusOr<int> version = MigratePgSchema(*store->writer_);
  if (!version.ok()) return version.status();
  store->schema_version_ = *version;
  absl::StatusOr<std::unique_ptr<PgConnection>> reader =
      PgConnection::Connect(conninfo, &store->counters_);
  if (!reader.ok()) return reader.status();
  absl::MutexLock lock(&store->read_mu_);
  store->reader_ = *std::move(reader);
  return store;
}

PgStore::~PgStore() = default;

std::vector<StoreCounter> PgStore::Counters() const {
  return {{"trainwatch_store_replication_doubts_total",
           "Commits PostgreSQL reported done whose wait for the synchronous standby was "
           "cancelled: refused, never acknowledged.",
           counters_.replication_doubts()}};
}

absl::Status PgStore::Write(const WriteBatch& b) {
  if (b.empty()) return absl::OkStatus();
  return OnWriter([&](PgConnection& c) -> absl::Status {
    if (absl::Status s = c.Begin(); !s.ok()) return s;
    // Fenced first: the lease rows read FOR SHARE make a takeover wait for
    // this commit, or this transaction sees the takeover's epoch.
    absl::Status s = fence_ != nullptr ? fence_->CheckFence(c, AllShards(*fence_))
                                       : absl::OkStatus();
    if (s.ok()) s = WriteTables(c, b, engine_snapshots_kept_);
    if (s.ok()) {
      s = c.Commit();  // the ack rule is Commit's
      // Committed, but the lease may have lapsed while the commit waited (a
      // slow standby, a pause): acknowledged now, it could follow a
      // takeover. The agents re-send it to the new owner, which stores it
      // once.
      if (s.ok() && fence_ != nullptr && !fence_->MayAcknowledge(0)) {
        return absl::UnavailableError("fenced: the lease lapsed during the commit; not acknowledged");
      }
      return s;
    }
    if (absl::Status r = c.Rollback(); !r.ok()) {
      // A connection left inside a transaction would refuse every later
      // batch: as unavailable, it is dropped and opened again.
      return absl::UnavailableError(
          absl::StrCat(s.message(), "; and the rollback failed: ", r.message()));
    }
    return s;
  });
}

// ---- the writer's connection (the writer thread)

absl::StatusOr<std::vector<RunRow>> PgStore::LoadRuns() {
  return OnWriter([](PgConnection& c) { return Runs(c); });
}

absl::Status PgStore::ForEachStep(
    const std::string& run_id, int64_t attempt,
    const std::function<void(const StepRow&, const std::string&)>& fn, int64_t after_step) {
  return OnWriter([&](PgConnection& c) -> absl::Status {
    const std::string sql = absl::StrCat(
        "SELECT ", kStepColumns,
        ", (SELECT uri FROM checkpoints c WHERE c.run_id = s.run_id AND c.step = s.step) "
        "FROM steps s WHERE run_id = $1::text AND attempt = $2::bigint AND NOT late AND "
        "step > $3::bigint ORDER BY step LIMIT $4::bigint");
    for (int64_t after = after_step;;) {
      absl::StatusOr<PgRows> rows = c.Execute(sql, {run_id, attempt, after, kStepsPerRead});
      if (!rows.ok()) return rows.status();
      for (int i = 0; i < rows->rows(); ++i) {
        const Cells r(*rows, i);
        const StepRow step = ReadStep(r);
        after = step.step;
        fn(step, r.Text(kStepColumnCount));
      }
      if (rows->rows() < kStepsPerRead) return absl::OkStatus();
    }
  });
}

absl::StatusOr<std::optional<EngineSnapshotRow>> PgStore::LatestEngineSnapshot(
    const std::string& run_id, int64_t attempt, int64_t max_step) {
  return OnWriter([&](PgConnection& c) {
    return QueryFirst(c,
                      "SELECT step, skipped, overflows, written_ms, state FROM engine_snapshots "
                      "WHERE run_id = $1::text AND attempt = $2::bigint AND step <= $3::bigint "
                      "ORDER BY step DESC LIMIT 1",
                      {run_id, attempt, max_step}, [&](const Cells& r) {
                        return EngineSnapshotRow{run_id,   attempt,  r.Int(0),  r.Int(1),
                                                 r.Int(2), r.Int(3), r.Blob(4)};
                      });
  });
}

absl::StatusOr<std::vector<RankStepRow>> PgStore::LoadRankStepsAfter(const std::string& run_id,
                                                                     int64_t attempt,
                                                                     int64_t step) {
  return OnWriter(
      [&](PgConnection& c) { return SelectRankSteps(c, run_id, attempt, ">", step); });
}

absl::StatusOr<std::vector<std::string>> PgStore::Incarnations(const std::string& run_id) {
  return OnWriter([&](PgConnection& c) {
    return Query(c, "SELECT incarnation FROM incarnations WHERE run_id = $1::text", {run_id},
                 [](const Cells& r) { return r.Text(0); });
  });
}

absl::StatusOr<int64_t> PgStore::MaxIncidentId() {
  return OnWriter([](PgConnection& c) {
    return QueryInt(c, "SELECT COALESCE(MAX(id), 0) FROM incidents", {});
  });
}

absl::StatusOr<int64_t> PgStore::MaxDecisionId() {
  return OnWriter([](PgConnection& c) {
    return QueryInt(c, "SELECT COALESCE(MAX(id), 0) FROM decisions", {});
  });
}

absl::StatusOr<std::optional<DecisionRow>> PgStore::FindDecisionByKey(const std::string& key) {
  return OnWriter([&](PgConnection& c) {
    return QueryFirst(
        c,
        absl::StrCat("SELECT ", kDecisionColumns,
                     " FROM decisions WHERE idempotency_key = $1::text"),
        {key}, ReadDecision<Cells>);
  });
}

absl::StatusOr<std::optional<CommandRow>> PgStore::LatestCommand(int64_t incident_id) {
  return OnWriter([&](PgConnection& c) {
    return QueryFirst(c,
                      "SELECT id, run_id, incident_id, kind, payload, created_ms FROM commands "
                      "WHERE incident_id = $1::bigint ORDER BY created_ms DESC, id DESC LIMIT 1",
                      {incident_id}, [](const Cells& r) {
                        return CommandRow{r.Text(0), r.Text(1),  r.Int(2),
                                          r.Text(3), r.Blob(4), r.Int(5)};
                      });
  });
}

absl::StatusOr<std::vector<CommandAckRow>> PgStore::CommandAcks(const std::string& run_id,
                                                                const std::string& command_id) {
  return OnWriter([&](PgConnection& c) {
    return Query(c,
                 "SELECT command_id, run_id, rank, status, message, resumed_step, at_ms FROM "
                 "command_acks WHERE command_id = $1::text AND run_id = $2::text "
                 "ORDER BY at_ms, rank, status",
                 {command_id, run_id}, [](const Cells& r) {
                   return CommandAckRow{r.Text(0),
                                        r.Text(1),
                                        static_cast<int32_t>(r.Int(2)),
                                        static_cast<int>(r.Int(3)),
                                        r.Text(4),
                                        r.Int(5),
                                        r.Int(6)};
                 });
  });
}

// ---- the read connection (any thread, one at a time)

absl::StatusOr<std::vector<RankStepRow>> PgStore::RankStepsAt(const std::string& run_id,
                                                              int64_t attempt, int64_t step) {
  return OnReader(
      [&](PgConnection& c) { return SelectRankSteps(c, run_id, attempt, "=", step); });
}

absl::StatusOr<std::vector<IncidentRow>> PgStore::ListIncidents(const IncidentFilter& f) {
  return OnReader([&](PgConnection& c) -> absl::StatusOr<std::vector<IncidentRow>> {
    absl::Status bad;
    absl::StatusOr<std::vector<IncidentRow>> rows = Query(
        c,
        absl::StrCat("SELECT ", kIncidentColumns,
                     " FROM incidents WHERE ($1::text = '' OR run_id = $1::text) AND "
                     "($2::boolean = false OR state NOT IN (5, 6)) AND "
                     "($3::integer < 0 OR tier = $3::integer) AND id > $4::bigint "
                     "ORDER BY id LIMIT $5::bigint"),
        {f.run_id, Bool(f.open_only), f.tier, f.after_id, f.limit},
        [&bad](const Cells& r) { return ReadIncident(r, &bad); });
    if (!bad.ok()) return bad;
    return rows;
  });
}

absl::StatusOr<std::optional<IncidentRow>> PgStore::GetIncident(int64_t id) {
  return OnReader([&](PgConnection& c) -> absl::StatusOr<std::optional<IncidentRow>> {
    absl::Status bad;
    absl::StatusOr<std::optional<IncidentRow>> row = QueryFirst(
        c, absl::StrCat("SELECT ", kIncidentColumns, " FROM incidents WHERE id = $1::bigint"),
        {id}, [&bad](const Cells& r) { return ReadIncident(r, &bad); });
    if (!bad.ok()) return bad;
    return row;
  });
}

absl::StatusOr<std::vector<EventRow>> PgStore::EventsOfIncident(int64_t id) {
  return OnReader([&](PgConnection& c) {
    return Query(c,
                 absl::StrCat("SELECT ", rows::kEventColumns,
                              " FROM events WHERE incident_id = $1::bigint ORDER BY id"),
                 {id}, [&](const Cells& q) { return rows::ReadEvent(q, id); });
  });
}

absl::StatusOr<std::vector<StepRow>> PgStore::RecentSteps(const std::string& run_id,
                                                          int64_t attempt, int limit) {
  return OnReader([&](PgConnection& c) {
    absl::StatusOr<std::vector<StepRow>> out =
        Query(c,
              absl::StrCat("SELECT ", kStepColumns,
                           " FROM steps WHERE run_id = $1::text AND attempt = $2::bigint "
                           "ORDER BY step DESC LIMIT $3::bigint"),
              {run_id, attempt, limit}, ReadStep<Cells>);
    if (out.ok()) std::reverse(out->begin(), out->end());
    return out;
  });
}

absl::StatusOr<std::vector<StepRow>> PgStore::StepsBetween(const std::string& run_id,
                                                           int64_t attempt, int64_t first,
                                                           int64_t last) {
  return OnReader([&](PgConnection& c) {
    return Query(c,
                 absl::StrCat("SELECT ", kStepColumns,
                              " FROM steps WHERE run_id = $1::text AND attempt = $2::bigint AND "
                              "step >= $3::bigint AND step <= $4::bigint ORDER BY step"),
                 {run_id, attempt, first, last}, ReadStep<Cells>);
  });
}

absl::StatusOr<std::vector<CheckpointRow>> PgStore::Checkpoints(const std::string& run_id) {
  return OnReader([&](PgConnection& c) {
    return Query(c,
                 "SELECT step, uri, reported_ms FROM checkpoints WHERE run_id = $1::text "
                 "ORDER BY step",
                 {run_id}, [&](const Cells& r) {
                   return CheckpointRow{run_id, r.Int(0), r.Text(1), r.Int(2)};
                 });
  });
}

absl::StatusOr<std::vector<std::pair<uint64_t, int64_t>>> PgStore::FlaggedShards(
    const std::string& run_id) {
  return OnReader([&](PgConnection& c) {
    return Query(c,
                 "SELECT shard, incident_id FROM flagged_shards WHERE run_id = $1::text "
                 "ORDER BY shard, incident_id",
                 {run_id}, [](const Cells& r) {
                   return std::pair<uint64_t, int64_t>(static_cast<uint64_t>(r.Int(0)),
                                                       r.Int(1));
                 });
  });
}

absl::StatusOr<int64_t> PgStore::CountSteps(const std::string& run_id) {
  return OnReader([&](PgConnection& c) {
    return QueryInt(c, "SELECT COUNT(*) FROM steps WHERE run_id = $1::text", {run_id});
  });
}

absl::StatusOr<std::vector<AttemptRow>> PgStore::Attempts(const std::string& run_id,
                                                          int64_t current) {
  return OnReader([&](PgConnection& c) { return server::Attempts(c, run_id, current); });
}

absl::StatusOr<int64_t> PgStore::CountSkipped(const std::string& run_id, int64_t attempt) {
  // The WHERE implies the partial index's own (migration 1), so the planner
  // reads the rare rows it holds.
  static_assert(static_cast<int>(core::Decision::kSkipUpdate) == 1);
  return OnReader([&](PgConnection& c) {
    return QueryInt(c,
                    "SELECT COUNT(*) FROM steps WHERE run_id = $1::text AND attempt = $2::bigint "
                    "AND decision = 1 AND NOT late",
                    {run_id, attempt});
  });
}

absl::StatusOr<int64_t> PgStore::CountLossScaleOverflows(const std::string& run_id,
                                                         int64_t attempt) {
  return OnReader([&](PgConnection& c) {
    return QueryInt(c,
                    "SELECT COUNT(*) FROM steps WHERE run_id = $1::text AND attempt = $2::bigint "
                    "AND loss_scale_overflow AND NOT late",
                    {run_id, attempt});
  });
}

absl::StatusOr<std::vector<DecisionRow>> PgStore::DecisionsOfIncident(int64_t incident_id) {
  return OnReader([&](PgConnection& c) {
    return Query(c,
                 absl::StrCat("SELECT ", kDecisionColumns,
                              " FROM decisions WHERE incident_id = $1::bigint ORDER BY id"),
                 {incident_id}, ReadDecision<Cells>);
  });
}

absl::StatusOr<std::vector<QuarantineRow>> PgStore::Quarantines(const std::string& run_id) {
  return OnReader([&](PgConnection& c) {
    return Query(c,
                 "SELECT first_shard, last_shard, incident_id, decision_id, created_ms, name "
                 "FROM quarantined_shards WHERE run_id = $1::text ORDER BY id",
                 {run_id}, [&](const Cells& r) {
                   return QuarantineRow{run_id,
                                        static_cast<uint64_t>(r.Int(0)),
                                        static_cast<uint64_t>(r.Int(1)),
                                        r.Int(2),
                                        r.Int(3),
                                        r.Int(4),
                                        r.IsNull(5) ? std::string() : r.Text(5)};
                 });
  });
}

absl::StatusOr<std::vector<OutboxRow>> PgStore::DueOutbox(int64_t now_ms, int limit) {
  return OnReader([&](PgConnection& c) {
    return Query(c,
                 absl::StrCat("SELECT ", kOutboxColumns,
                              " FROM outbox WHERE state = 'pending' AND "
                              "next_attempt_ms <= $1::bigint ORDER BY id LIMIT $2::bigint"),
                 {now_ms, limit}, ReadOutbox<Cells>);
  });
}

absl::StatusOr<std::vector<OutboxRow>> PgStore::Outbox(int64_t incident_id) {
  return OnReader([&](PgConnection& c) {
    return Query(c,
                 absl::StrCat("SELECT ", kOutboxColumns,
                              " FROM outbox WHERE incident_id = $1::bigint ORDER BY id"),
                 {incident_id}, ReadOutbox<Cells>);
  });
}

absl::Status PgStore::MarkOutbox(int64_t id, bool sent, int attempts, int64_t next_attempt_ms,
                                 const std::string& error, int64_t now_ms) {
  // On the read connection under its mutex, as the SQLite backend does; the
  // statement commits by itself, under the ack rule like any commit.
  return OnReader([&](PgConnection& c) {
    return Run(c,
               "UPDATE outbox SET state = $2::text, attempts = $3::integer, "
               "next_attempt_ms = $4::bigint, last_error = $5::text, sent_ms = $6::bigint "
               "WHERE id = $1::bigint",
               {id, sent ? "sent" : "pending", attempts, next_attempt_ms, error,
                sent ? now_ms : int64_t{0}});
  });
}

}  // namespace trainwatch::server
