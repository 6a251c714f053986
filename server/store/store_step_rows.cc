#include "store/store_step_rows.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "store/row_readers.h"
#include "store/sql_statement.h"
#include "trainwatch/core/event.h"

namespace trainwatch::server::rows {

namespace {


// No counts (core::GradCounts) are stored as NULL, NULL.
void BindCounts(SqlStatement& q, int i, const core::GradCounts& c) {
  if (c.has_counts()) {
    q.Bind(i, static_cast<int64_t>(c.nonfinite)).Bind(i + 1, static_cast<int64_t>(c.elements));
  } else {
    q.BindNull(i).BindNull(i + 1);
  }
}


// The run's reports of the steps `op` ?3 ("=", ">"), by step then rank.
absl::StatusOr<std::vector<RankStepRow>> SelectRankSteps(sqlite3* db, const std::string& run_id,
                                                         int64_t attempt, absl::string_view op,
                                                         int64_t step) {
  SqlStatement q(db, absl::StrCat("SELECT rank, step, report FROM rank_steps WHERE run_id = ?1 "
                                  "AND attempt = ?2 AND step ",
                                  op, " ?3 ORDER BY step, rank"));
  q.Bind(1, run_id).Bind(2, attempt).Bind(3, step);
  return q.All([&](const SqlStatement& r) { return ReadRankStep(r, run_id, attempt); });
}

}  // namespace

absl::Status UpsertRuns(sqlite3* db, const std::vector<RunRow>& runs) {
  SqlStatement q(db,
                 "INSERT INTO runs (run_id, world_size, attempt, last_step, created_ms, "
                 "last_seen_ms, incarnation, resume_step, observed) "
                 "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) "
                 "ON CONFLICT(run_id) DO UPDATE "
                 "SET world_size=excluded.world_size, attempt=excluded.attempt, "
                 "last_step=excluded.last_step, last_seen_ms=excluded.last_seen_ms, "
                 "incarnation=excluded.incarnation, resume_step=excluded.resume_step, "
                 "observed=excluded.observed");
  absl::Status s = q.RunEach(runs, [](SqlStatement& q, const RunRow& r) {
    q.Bind(1, r.run_id).Bind(2, int64_t{r.world_size}).Bind(3, r.attempt);
    q.Bind(4, r.last_step).Bind(5, r.created_ms).Bind(6, r.last_seen_ms);
    q.Bind(7, r.incarnation);
    if (r.resume_step) {
      q.Bind(8, *r.resume_step);
    } else {
      q.BindNull(8);
    }
    q.Bind(9, int64_t{r.observed});
  });
  if (!s.ok()) return s;
  // The rules change once or twice in a run's life, the row above at every
  // batch: an unchanged rules row is compared, never rewritten (migration 11).
  SqlStatement rules(db,
                     "INSERT INTO run_rules (run_id, rules_json, rules_source) VALUES (?1, ?2, ?3) "
                     "ON CONFLICT(run_id) DO UPDATE "
                     "SET rules_json=excluded.rules_json, rules_source=excluded.rules_source "
                     "WHERE rules_json != excluded.rules_json OR "
                     "rules_source != excluded.rules_source");
  s = rules.RunEach(runs, [](SqlStatement& q, const RunRow& r) {
    q.BindUncopied(1, r.run_id).BindUncopied(2, r.rules_json).BindUncopied(3, r.rules_source);
  });
  if (!s.ok()) return s;
  // Likewise what `trainwatch run` found (migration 12).
  SqlStatement attachment(db,
                          "INSERT INTO run_attachments (run_id, attachment) VALUES (?1, ?2) "
                          "ON CONFLICT(run_id) DO UPDATE SET attachment=excluded.attachment "
                          "WHERE attachment != excluded.attachment");
  return attachment.RunEach(runs, [](SqlStatement& q, const RunRow& r) {
    q.BindUncopied(1, r.run_id).BindUncopied(2, r.attachment);
  });
}

absl::StatusOr<std::vector<RunRow>> Runs(sqlite3* db) {
  SqlStatement q(db,
                 "SELECT runs.run_id, world_size, attempt, last_step, created_ms, last_seen_ms, "
                 "incarnation, resume_step, observed, ifnull(rules_json, ''), "
                 "ifnull(rules_source, ''), ifnull(attachment, '') FROM runs "
                 "LEFT JOIN run_rules USING (run_id) LEFT JOIN run_attachments USING (run_id) "
                 "ORDER BY runs.run_id");
  return q.All(ReadRun<SqlStatement>);
}

absl::Status InsertSteps(sqlite3* db, const std::vector<WriteBatch::Step>& steps) {
  return InsertRows(
      db, absl::StrCat("INSERT OR IGNORE INTO steps (run_id, attempt, ", kStepColumns, ") VALUES"),
      kStepColumnCount + 2, steps, [](SqlStatement& q, int b, const WriteBatch::Step& w) {
        const StepRow& s = w.step;
        q.BindUncopied(b + 1, w.run_id).Bind(b + 2, w.attempt).Bind(b + 3, s.step);
        for (int i = 0; i < core::kNumSignals; ++i) {
          const auto signal = static_cast<core::Signal>(i);
          if (s.Has(signal)) {
            q.Bind(b + 4 + i, s.Get(signal));
          } else {
            q.BindNull(b + 4 + i);
          }
        }
        q.Bind(b + 12, int64_t{s.present()}).Bind(b + 13, s.loss_ema_ratio);
        BindCounts(q, b + 14, s);
        q.Bind(b + 16, int64_t{s.decision}).BindShards(b + 17, s.shards);
        q.BindUncopied(b + 18, s.missing_ranks).Bind(b + 19, int64_t{s.late});
        q.Bind(b + 20, s.received_ms).BindShardNames(b + 21, s.shard_names);
        if (s.HasLossScale()) {
          q.Bind(b + 22, s.loss_scale()).Bind(b + 23, int64_t{s.loss_scale_overflow()});
        } else {
          q.BindNull(b + 22).BindNull(b + 23);
        }
      });
}

absl::Status CopyAttempts(sqlite3* db, const std::vector<AttemptCopy>& copies) {
  if (copies.empty()) return absl::OkStatus();
  SqlStatement q(db, absl::StrCat("INSERT OR IGNORE INTO steps (run_id, attempt, ", kStepColumns,
                                  ") SELECT run_id, ?2, ", kStepColumns,
                                  " FROM steps WHERE run_id = ?1 AND attempt = ?3 AND step <= ?4"));
  if (absl::Status s = q.RunEach(copies, [](SqlStatement& q, const AttemptCopy& a) {
        q.Bind(1, a.run_id).Bind(2, a.to_attempt).Bind(3, a.from_attempt).Bind(4, a.up_to_step);
      });
      !s.ok()) {
    return s;
  }
  SqlStatement how(db,
                   "INSERT OR IGNORE INTO attempts (run_id, attempt, start, incident_id, "
                   "incarnation, from_step, started_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)");
  return how.RunEach(copies, [](SqlStatement& q, const AttemptCopy& a) {
    q.Bind(1, a.run_id).Bind(2, a.to_attempt).Bind(3, int64_t{static_cast<int>(a.start)});
    q.Bind(4, a.incident_id).Bind(5, a.incarnation).Bind(6, a.up_to_step).Bind(7, a.started_ms);
  });
}

absl::StatusOr<std::vector<AttemptRow>> Attempts(sqlite3* db, const std::string& run_id,
                                                 int64_t current) {
  std::vector<AttemptRow> out(static_cast<size_t>(std::max<int64_t>(current, 0)) + 1);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].attempt = static_cast<int64_t>(i);
    // Attempts begun before migration 4 have no row: only rollbacks did.
    out[i].start = i == 0 ? AttemptStart::kFirst : AttemptStart::kRollback;
  }
  SqlStatement how(db,
                   "SELECT attempt, start, incident_id, incarnation, from_step, started_ms FROM "
                   "attempts WHERE run_id = ?1 AND attempt >= 0 AND attempt <= ?2");
  how.Bind(1, run_id).Bind(2, current);
  absl::Status st;
  while (how.Next(&st)) {
    AttemptRow& a = out[static_cast<size_t>(how.Int(0))];
    a.start = static_cast<AttemptStart>(how.Int(1));
    a.incident_id = how.Int(2);
    a.incarnation = how.Text(3);
    a.from_step = how.Int(4);
    a.started_ms = how.Int(5);
  }
  if (!st.ok()) return st;
  SqlStatement range(db,
                     "SELECT attempt, MIN(step), MAX(step) FROM steps WHERE run_id = ?1 AND "
                     "attempt >= 0 AND attempt <= ?2 GROUP BY attempt");
  range.Bind(1, run_id).Bind(2, current);
  while (range.Next(&st)) {
    AttemptRow& a = out[static_cast<size_t>(range.Int(0))];
    a.first_step = range.Int(1);
    a.last_step = range.Int(2);
  }
  if (!st.ok()) return st;
  return out;
}

absl::Status InsertIncarnations(sqlite3* db, const std::vector<IncarnationRow>& rows) {
  if (rows.empty()) return absl::OkStatus();
  SqlStatement q(db,
                 "INSERT OR IGNORE INTO incarnations (run_id, incarnation, seen_ms) "
                 "VALUES (?1, ?2, ?3)");
  return q.RunEach(rows, [](SqlStatement& q, const IncarnationRow& r) {
    q.Bind(1, r.run_id).Bind(2, r.incarnation).Bind(3, r.seen_ms);
  });
}

absl::StatusOr<std::vector<std::string>> Incarnations(sqlite3* db, const std::string& run_id) {
  SqlStatement q(db, "SELECT incarnation FROM incarnations WHERE run_id = ?1");
  q.Bind(1, run_id);
  return q.All([](const SqlStatement& r) { return r.Text(0); });
}

absl::Status ForEachStep(sqlite3* db, const std::string& run_id, int64_t attempt,
                         const std::function<void(const StepRow&, const std::string&)>& fn,
                         int64_t after_step) {
  SqlStatement q(db, absl::StrCat("SELECT ", kStepColumns,
                                  ", (SELECT uri FROM checkpoints c WHERE c.run_id = s.run_id AND "
                                  "c.step = s.step) FROM steps s WHERE run_id = ?1 AND "
                                  "attempt = ?2 AND late = 0 AND step > ?3 ORDER BY step"));
  q.Bind(1, run_id).Bind(2, attempt).Bind(3, after_step);
  absl::Status st;
  while (q.Next(&st)) fn(ReadStep(q), q.Text(kStepColumnCount));
  return st;
}

absl::StatusOr<std::vector<StepRow>> RecentSteps(sqlite3* db, const std::string& run_id,
                                                    int64_t attempt, int limit) {
  SqlStatement q(db, absl::StrCat("SELECT ", kStepColumns,
                                  " FROM steps WHERE run_id = ?1 AND attempt = ?2 ORDER BY step "
                                  "DESC LIMIT ?3"));
  q.Bind(1, run_id).Bind(2, attempt).Bind(3, int64_t{limit});
  absl::StatusOr<std::vector<StepRow>> out = q.All(ReadStep<SqlStatement>);
  if (out.ok()) std::reverse(out->begin(), out->end());
  return out;
}

absl::StatusOr<std::vector<StepRow>> StepsBetween(sqlite3* db, const std::string& run_id,
                                                     int64_t attempt, int64_t first, int64_t last) {
  SqlStatement q(db, absl::StrCat("SELECT ", kStepColumns,
                                  " FROM steps WHERE run_id = ?1 AND attempt = ?2 AND "
                                  "step >= ?3 AND step <= ?4 ORDER BY step"));
  q.Bind(1, run_id).Bind(2, attempt).Bind(3, first).Bind(4, last);
  return q.All(ReadStep<SqlStatement>);
}

absl::StatusOr<int64_t> CountSteps(sqlite3* db, const std::string& run_id) {
  SqlStatement q(db, "SELECT COUNT(*) FROM steps WHERE run_id = ?1");
  q.Bind(1, run_id);
  return QueryInt(q);
}

absl::StatusOr<int64_t> CountSkipped(sqlite3* db, const std::string& run_id, int64_t attempt) {
  // The WHERE repeats the partial index's own (migration 10) with the same
  // literals, as SQLite requires; INDEXED BY because the planner, without
  // statistics, would take the primary key's equal prefix and read every
  // step of the attempt.
  static_assert(static_cast<int>(core::Decision::kSkipUpdate) == 1);
  SqlStatement q(db,
                 "SELECT COUNT(*) FROM steps INDEXED BY steps_skipped WHERE run_id = ?1 AND "
                 "attempt = ?2 AND decision = 1 AND late = 0");
  q.Bind(1, run_id).Bind(2, attempt);
  return QueryInt(q);
}

absl::StatusOr<int64_t> CountLossScaleOverflows(sqlite3* db, const std::string& run_id,
                                                int64_t attempt) {
  SqlStatement q(db,
                 "SELECT COUNT(*) FROM steps INDEXED BY steps_overflowed WHERE run_id = ?1 AND "
                 "attempt = ?2 AND loss_scale_overflow = 1 AND late = 0");
  q.Bind(1, run_id).Bind(2, attempt);
  return QueryInt(q);
}

absl::Status InsertRankSteps(sqlite3* db, const std::vector<RankStepRow>& rows) {
  return InsertRows(db, "INSERT OR IGNORE INTO rank_steps (run_id, attempt, rank, step, report) VALUES",
                    5, rows, [](SqlStatement& q, int b, const RankStepRow& r) {
                      q.BindUncopied(b + 1, r.run_id).Bind(b + 2, r.attempt);
                      q.Bind(b + 3, int64_t{r.rank}).Bind(b + 4, r.step);
                      q.BindBlobUncopied(b + 5, r.report);
                    });
}

absl::StatusOr<std::vector<RankStepRow>> RankStepsAt(sqlite3* db, const std::string& run_id,
                                                     int64_t attempt, int64_t step) {
  return SelectRankSteps(db, run_id, attempt, "=", step);
}

absl::StatusOr<std::vector<RankStepRow>> RankStepsAfter(sqlite3* db, const std::string& run_id,
                                                        int64_t attempt, int64_t step) {
  return SelectRankSteps(db, run_id, attempt, ">", step);
}

absl::Status ReplaceCheckpoints(sqlite3* db, const std::vector<CheckpointRow>& rows) {
  if (rows.empty()) return absl::OkStatus();
  SqlStatement q(db,
                 "INSERT OR REPLACE INTO checkpoints (run_id, step, uri, reported_ms) "
                 "VALUES (?1, ?2, ?3, ?4)");
  return q.RunEach(rows, [](SqlStatement& q, const CheckpointRow& c) {
    q.Bind(1, c.run_id).Bind(2, c.step).Bind(3, c.uri).Bind(4, c.reported_ms);
  });
}

absl::StatusOr<std::vector<CheckpointRow>> Checkpoints(sqlite3* db, const std::string& run_id) {
  SqlStatement q(db,
                 "SELECT step, uri, reported_ms FROM checkpoints WHERE run_id = ?1 ORDER BY step");
  q.Bind(1, run_id);
  return q.All([&](const SqlStatement& r) {
    return CheckpointRow{run_id, r.Int(0), r.Text(1), r.Int(2)};
  });
}

}  // namespace trainwatch::server::rows
