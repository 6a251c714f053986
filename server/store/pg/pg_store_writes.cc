// The tables of a batch (Store::Write), written by the PostgreSQL backend.
#include "store/pg/pg_store_writes.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "store/pg/pg_values.h"
#include "store/row_readers.h"
#include "trainwatch/core/event.h"
#include "trainwatch/core/json.h"

namespace trainwatch::server::pg {

namespace {

using rows::kIncidentColumns;
using rows::kStepColumns;

// ---- runs, steps, rank steps, checkpoints, attempts, incarnations


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
    s = Run(c,
            "INSERT INTO run_attachments (run_id, attachment) VALUES ($1::text, $2::text) "
            "ON CONFLICT (run_id) DO UPDATE SET attachment = excluded.attachment "
            "WHERE run_attachments.attachment <> excluded.attachment",
            {r.run_id, r.attachment});
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
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

}  // namespace

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

}  // namespace trainwatch::server::pg
