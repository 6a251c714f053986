// twctl follow against a real trainwatchd: the twctl binary follows a file,
// a pipe or a TensorBoard folder while the test writes it, and what the
// server stored is compared with what replay's reader makes of the whole log.

#include <signal.h>
#include <sys/stat.h>
#include <sqlite3.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "logs/shapes.h"
#include "testing/event_file_writer.h"
#include "stack.h"
#include "test_util.h"
#include "testing/wait.h"
#include "trainwatch/core/event.h"
#include "trainwatch/logs/line_pattern.h"
#include "trainwatch/logs/metrics_file.h"
#include "trainwatch/logs/replay.h"

namespace trainwatch::cli {

using logs::FormatName;
using logs::MetricsFormat;
using logs::ParseMetrics;
using logs::ReadOptions;
using logs::Trace;

namespace {

using ::trainwatch::testing::Child;
using ::trainwatch::testing::QueryInt;
using ::trainwatch::testing::ReadFile;
using ::trainwatch::testing::TempDir;
using ::trainwatch::testing::Trainwatchd;
using ::trainwatch::testing::WaitUntil;

struct Row {
  int64_t attempt, step;
  double loss, grad_norm;
};

// The run's stored steps, in attempt and step order.
std::vector<Row> Stored(const std::string& db, const std::string& run) {
  std::vector<Row> rows;
  sqlite3* conn = nullptr;
  if (sqlite3_open_v2(db.c_str(), &conn, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    sqlite3_close(conn);
    return rows;
  }
  sqlite3_busy_timeout(conn, 2000);
  sqlite3_stmt* st = nullptr;
  const std::string sql = "SELECT attempt, step, loss, grad_norm FROM steps WHERE run_id = '" +
                          run + "' ORDER BY attempt, step";
  if (sqlite3_prepare_v2(conn, sql.c_str(), -1, &st, nullptr) == SQLITE_OK) {
    while (sqlite3_step(st) == SQLITE_ROW) {
      rows.push_back({sqlite3_column_int64(st, 0), sqlite3_column_int64(st, 1),
                      sqlite3_column_double(st, 2), sqlite3_column_double(st, 3)});
    }
  }
  sqlite3_finalize(st);
  sqlite3_close(conn);
  return rows;
}

// What replay reads from the whole log, as rows of one attempt per restart.
std::vector<Row> Replayed(const std::string& content, MetricsFormat format,
                          ReadOptions options = ReadOptions()) {
  options.format = format;
  absl::StatusOr<Trace> trace = ParseMetrics(content, "log", options);
  REQUIRE(trace.ok());
  std::vector<Row> rows;
  int64_t attempt = 0;
  for (size_t i = 0; i < trace->size(); ++i) {
    const core::StepRecord r = trace->Record(i);
    if (i > 0 && r.step <= rows.back().step) {
      // A restart: the server's new attempt begins with the history it
      // resumed from (the earlier attempt's steps up to the resume step).
      const std::vector<Row> before = rows;
      ++attempt;
      for (const Row& b : before) {
        if (b.attempt == attempt - 1 && b.step < r.step)
          rows.push_back({attempt, b.step, b.loss, b.grad_norm});
      }
    }
    rows.push_back({attempt, r.step, r.Get(core::Signal::kLoss), r.Get(core::Signal::kGradNorm)});
  }
  return rows;
}

void RequireSame(const std::vector<Row>& stored, const std::vector<Row>& expected) {
  REQUIRE(stored.size() == expected.size());
  for (size_t i = 0; i < stored.size(); ++i) {
    INFO("row " << i << " step " << expected[i].step);
    CHECK(stored[i].attempt == expected[i].attempt);
    CHECK(stored[i].step == expected[i].step);
    CHECK(stored[i].loss == Approx(expected[i].loss).epsilon(1e-6));
    CHECK(stored[i].grad_norm == Approx(expected[i].grad_norm).epsilon(1e-6));
  }
}

// The run's stored events as (step, tier), in the order they were stored.
std::vector<std::pair<int64_t, int64_t>> StoredEvents(const std::string& db,
                                                      const std::string& run) {
  std::vector<std::pair<int64_t, int64_t>> out;
  sqlite3* conn = nullptr;
  if (sqlite3_open_v2(db.c_str(), &conn, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    sqlite3_close(conn);
    return out;
  }
  sqlite3_busy_timeout(conn, 2000);
  sqlite3_stmt* st = nullptr;
  const std::string sql =
      "SELECT step, tier FROM events WHERE run_id = '" + run + "' ORDER BY id";
  if (sqlite3_prepare_v2(conn, sql.c_str(), -1, &st, nullptr) == SQLITE_OK) {
    while (sqlite3_step(st) == SQLITE_ROW) {
      out.emplace_back(sqlite3_column_int64(st, 0), sqlite3_column_int64(st, 1));
    }
  }
  sqlite3_finalize(st);
  sqlite3_close(conn);
  return out;
}

bool WaitRows(const std::string& db, const std::string& run, size_t n) {
  return WaitUntil([&] { return Stored(db, run).size() >= n; }, std::chrono::seconds(15),
                   std::chrono::milliseconds(20));
}

std::string Llmc(int64_t from, int64_t to) {
  std::string out;
  for (int64_t s = from; s < to; ++s) {
    out += "s:" + std::to_string(s) + " trl:" + std::to_string(3.0 + 0.001 * (s % 97)) +
           " lr:0.0006 norm:" + std::to_string(0.5 + 0.002 * (s % 13)) + "\n";
  }
  return out;
}

std::string Megatron(int64_t from, int64_t to) {
  std::string out;
  for (int64_t s = from; s < to; ++s) {
    char line[400];
    std::snprintf(line, sizeof line,
                  " [2024-05-01 10:00:00] iteration %8ld/    1000 | consumed samples: %ld | "
                  "elapsed time per iteration (ms): 900.1 | learning rate: 3.000000E-04 | "
                  "global batch size: 8 | lm loss: %.6E | loss scale: 1.0 | grad norm: %.3f | "
                  "number of skipped iterations: 0 | number of nan iterations: 0 |\n",
                  static_cast<long>(s), static_cast<long>(s * 8), 4.0 + 0.001 * (s % 7),
                  1.0 + 0.01 * (s % 5));
    out += line;
    if (s % 10 == 0) {
      out += "saving checkpoint at iteration " + std::to_string(s) +
             " to /ckpt/run-m in torch "
             "format\n";
    }
  }
  return out;
}

// The Python frameworks' logs (logs/src/*_log.cc), as their trainers print
// them, steps [from, to).
std::string HfTrainer(int64_t from, int64_t to) {
  // tqdm.write: the bar cleared with '\r', the dict, the bar drawn again.
  std::string out;
  for (int64_t s = from; s < to; ++s) {
    char line[400];
    std::snprintf(line, sizeof line,
                  "\r 10%%|#         | %ld/100000 [00:10<01:30, 1.00it/s]\r%40s\r{'loss': %.4f, "
                  "'grad_norm': %.4f, 'learning_rate': 0.0003, 'epoch': 0.01}\n",
                  static_cast<long>(s), "", 3.0 + 0.001 * (s % 97), 0.5 + 0.002 * (s % 13));
    out += line;
  }
  return out;
}

std::string TorchTitan(int64_t from, int64_t to) {
  std::string out;
  for (int64_t s = from; s < to; ++s) {
    char line[400];
    for (int rank = 0; rank < 2; ++rank) {
      std::snprintf(line, sizeof line,
                    "[rank%d]:[titan] 2025-01-01 12:00:00,000 - root - INFO - \x1b[31mstep: %2ld  "
                    "\x1b[32mloss: %7.4f  \x1b[38;2;180;60;0mgrad_norm: %7.4f  "
                    "\x1b[38;2;54;234;195mmemory: 12.34GiB(15.00%%)  \x1b[34mtps: 1,234  "
                    "\x1b[36mtflops: 56.78  \x1b[35mmfu: 12.34%%\x1b[39m\n",
                    rank, static_cast<long>(s), 3.0 + 0.001 * (s % 97), 0.5 + 0.002 * (s % 13));
      out += line;
    }
  }
  return out;
}

std::string Composer(int64_t from, int64_t to) {
  std::string out;
  for (int64_t s = from; s < to; ++s) {
    char block[400];
    std::snprintf(block, sizeof block,
                  "[batch=%ld/100000]:\n\t Train time/batch: %ld\n\t Train loss/train/total: "
                  "%.4f\n\t Train l2_norm/grad/global: %.4f\n\t Train "
                  "lr-DecoupledAdamW/group0: 0.0003\n",
                  static_cast<long>(s), static_cast<long>(s - 1), 3.0 + 0.001 * (s % 97),
                  0.5 + 0.002 * (s % 13));
    out += block;
  }
  return out;
}

std::string Nemo(int64_t from, int64_t to) {
  std::string out;
  for (int64_t s = from; s < to; ++s) {
    char line[400];
    std::snprintf(line, sizeof line,
                  "Training epoch 0, iteration %ld/100000 | lr: 3e-05 | consumed_samples: %ld | "
                  "global_batch_size: 8 | global_step: %ld | reduced_train_loss: %.4f | "
                  "train_step_timing in s: 0.0315\n",
                  static_cast<long>(s), static_cast<long>(s * 8), static_cast<long>(s),
                  3.0 + 0.001 * (s % 97));
    out += line;
  }
  return out;
}

std::string LightningCsv(int64_t from, int64_t to) {
  std::string out = "epoch,grad_2.0_norm_total,step,train_loss,val_loss\n";
  for (int64_t s = from; s < to; ++s) {
    out += "0," + std::to_string(0.5 + 0.002 * (s % 13)) + "," + std::to_string(s) + "," +
           std::to_string(3.0 + 0.001 * (s % 97)) + ",\n";
    if (s % 10 == 0) out += "0,," + std::to_string(s) + ",,2.5\n";
  }
  return out;
}

// Hugging Face's trainer_state.json with train entries at steps
// 10, 20, ... up to `last`, and an eval entry every 50 steps.
std::string TrainerState(int64_t last) {
  std::string history;
  for (int64_t s = 10; s <= last; s += 10) {
    char entry[300];
    std::snprintf(entry, sizeof entry,
                  "%s    {\n      \"epoch\": 0.01,\n      \"grad_norm\": %.4f,\n      "
                  "\"learning_rate\": 0.0003,\n      \"loss\": %.4f,\n      \"step\": %ld\n    }",
                  history.empty() ? "" : ",\n", 0.5 + 0.002 * (s % 13), 3.0 + 0.001 * (s % 97),
                  static_cast<long>(s));
    history += entry;
    if (s % 50 == 0) {
      std::snprintf(entry, sizeof entry,
                    ",\n    {\n      \"epoch\": 0.01,\n      \"eval_loss\": 2.5,\n      "
                    "\"step\": %ld\n    }",
                    static_cast<long>(s));
      history += entry;
    }
  }
  return "{\n  \"best_metric\": null,\n  \"epoch\": 0.01,\n  \"global_step\": " +
         std::to_string(last) + ",\n  \"log_history\": [\n" + history +
         "\n  ],\n  \"logging_steps\": 10,\n  \"max_steps\": 100000\n}\n";
}

void Append(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::app) << text;
}

std::vector<std::string> FollowArgs(const std::string& source, const std::string& run,
                                    const Trainwatchd& d, std::vector<std::string> more = {}) {
  std::vector<std::string> argv = {TWCTL_PATH,  "follow",
                                   source,      "--run",
                                   run,         "--server",
                                   d.address(), "--poll-interval",
                                   "10",        "--status-interval",
                                   "1"};
  argv.insert(argv.end(), more.begin(), more.end());
  return argv;
}

TEST_CASE("follow: a Megatron log piped on stdin is stored as replay reads it with its checkpoints",
          "[cli][follow]") {
  TempDir dir;
  Trainwatchd d(dir, "", "");
  const std::string log = dir.File("train.log");
  const std::string content = "Megatron banner\n" + Megatron(1, 61);
  std::ofstream(log) << content;
  const std::string cmd = "cat '" + log + "' | exec '" TWCTL_PATH "' follow - --run run-pipe " +
                          "--server " + d.address();
  Child follow({"/bin/sh", "-c", cmd}, dir.File("follow.log"));
  // EOF ends the follow once every record is acknowledged.
  const int rc = follow.Wait(20);
  INFO(ReadFile(dir.File("follow.log")));
  REQUIRE(rc == 0);
  CHECK(ReadFile(dir.File("follow.log")).find("every record acknowledged") != std::string::npos);
  RequireSame(Stored(d.db(), "run-pipe"), Replayed(content, MetricsFormat::kMegatron));
  CHECK(QueryInt(d.db(), "SELECT COUNT(*) FROM checkpoints WHERE run_id = 'run-pipe'") == 6);
  CHECK(QueryInt(d.db(),
                 "SELECT COUNT(*) FROM checkpoints WHERE run_id = 'run-pipe' AND step = "
                 "30 AND uri = '/ckpt/run-m'") == 1);
}

TEST_CASE("follow: a pipe's lines are read when they arrive - not after the poll interval",
          "[cli][follow]") {
  TempDir dir;
  Trainwatchd d(dir, "", "");
  const std::string fifo = dir.File("pipe");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // A minute between polls: a follow that slept it out between reads of an
  // idle pipe would store nothing within the waits below.
  const std::string cmd = "exec '" TWCTL_PATH "' follow - --run run-fifo --server " + d.address() +
                          " --poll-interval 60000 --status-interval 0 < '" + fifo + "'";
  Child follow({"/bin/sh", "-c", cmd}, dir.File("follow.log"));
  {
    std::ofstream pipe(fifo);  // opens once the follow has opened its end
    pipe << Megatron(1, 11) << std::flush;
    INFO(ReadFile(dir.File("follow.log")));
    REQUIRE(WaitRows(d.db(), "run-fifo", 10));
    pipe << Megatron(11, 21) << std::flush;
    REQUIRE(WaitRows(d.db(), "run-fifo", 20));
  }
  // The writer closed: EOF ends the follow.
  CHECK(follow.Wait(20) == 0);
  RequireSame(Stored(d.db(), "run-fifo"), Replayed(Megatron(1, 21), MetricsFormat::kMegatron));
}

TEST_CASE("follow: rotation then truncation then a trainwatchd restart lose no line",
          "[cli][follow]") {
  TempDir dir;
  auto d = std::make_unique<Trainwatchd>(dir, "", "");
  const int port = d->port();
  const std::string log = dir.File("train.log");  // not there yet: waited for
  const std::string run = "run-tail";
  Child follow(FollowArgs(log, run, *d), dir.File("follow.log"));
  std::string all;
  auto write = [&](const std::string& text) {
    Append(log, text);
    all += text;
  };
  write("banner\n" + Llmc(0, 40));
  REQUIRE(WaitRows(d->db(), run, 40));
  // Rotation: the old file moves away, a new one takes its name.
  std::filesystem::rename(log, log + ".1");
  write(Llmc(40, 80));
  REQUIRE(WaitRows(d->db(), run, 80));
  // Truncation in place; the next lines once the follower has seen it.
  std::filesystem::resize_file(log, 0);
  REQUIRE(WaitUntil(
      [&] { return ReadFile(dir.File("follow.log")).find("truncated") != std::string::npos; },
      std::chrono::seconds(10), std::chrono::milliseconds(10)));
  write(Llmc(80, 120));
  REQUIRE(WaitRows(d->db(), run, 120));
  // trainwatchd killed: what is written meanwhile waits in the agent.
  d->Kill();
  d.reset();
  write(Llmc(120, 200));
  REQUIRE(WaitUntil(
      [&] { return ReadFile(dir.File("follow.log")).find("lines read 201") != std::string::npos; },
      std::chrono::seconds(10), std::chrono::milliseconds(10)));
  d = std::make_unique<Trainwatchd>(
      dir, "", "", std::vector<std::string>{"--listen", "127.0.0.1:" + std::to_string(port)});
  REQUIRE(WaitRows(d->db(), run, 200));
  ::kill(follow.pid(), SIGTERM);
  const int rc = follow.Wait(20);
  INFO(ReadFile(dir.File("follow.log")));
  CHECK(rc == 0);
  RequireSame(Stored(d->db(), run), Replayed(all, MetricsFormat::kLlmc));
}

TEST_CASE("follow: a log whose writer goes silent is a stall from its timing - a writer gone is none",
          "[cli][follow][liveness]") {
  TempDir dir;
  // The bound: 10 times the log's 200 ms between writes, at least 15 s.
  Trainwatchd d(dir, "", "", {"--stall_floor_seconds", "15"});
  const std::string stuck_log = dir.File("stuck.log"), ended_log = dir.File("ended.log");
  Child follow_stuck(FollowArgs(stuck_log, "run-stuck", d), dir.File("follow-stuck.log"));
  Child follow_ended(FollowArgs(ended_log, "run-ended", d), dir.File("follow-ended.log"));
  // This process writes both logs, each held open as a trainer's stdout is;
  // opened after the followers started, which would otherwise inherit them.
  auto stuck = std::make_unique<std::ofstream>(stuck_log);
  auto ended = std::make_unique<std::ofstream>(ended_log);
  auto last_write = std::chrono::steady_clock::now();
  for (int s = 0; s < 12; ++s) {  // 12 writes: the log's pace is learned from 8
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    *stuck << Llmc(s, s + 1) << std::flush;
    *ended << Llmc(s, s + 1) << std::flush;
    last_write = std::chrono::steady_clock::now();
  }
  REQUIRE(WaitRows(d.db(), "run-stuck", 12));
  REQUIRE(WaitRows(d.db(), "run-ended", 12));
  ended.reset();  // the job of run-ended exits; run-stuck's hangs, its log open
  const std::string stall = "SELECT count(*) FROM incidents WHERE kind = " +
                            std::to_string(static_cast<int>(core::EventKind::kStall)) +
                            " AND run_id = ";
  REQUIRE(WaitUntil([&] { return QueryInt(d.db(), stall + "'run-stuck'") == 1; },
                    std::chrono::seconds(60), std::chrono::milliseconds(100)));
  CHECK(std::chrono::steady_clock::now() - last_write >= std::chrono::seconds(15));
  CHECK(QueryInt(d.db(), stall + "'run-stuck' AND closed_ms = 0 AND title LIKE "
                         "'stalled: the log has written no step after step 11 for %'") == 1);
  // The follower of the ended job saw its writer go, and no stall came.
  CHECK(ReadFile(dir.File("follow-ended.log")).find("no process has it open for writing") !=
        std::string::npos);
  std::this_thread::sleep_until(last_write + std::chrono::seconds(20));
  CHECK(QueryInt(d.db(), stall + "'run-ended'") == 0);
  // The stuck job writes again: its stall resolves by itself.
  *stuck << Llmc(12, 13) << std::flush;
  CHECK(WaitUntil([&] { return QueryInt(d.db(), stall + "'run-stuck' AND closed_ms > 0") == 1; },
                  std::chrono::seconds(30), std::chrono::milliseconds(100)));
  for (Child* c : {&follow_stuck, &follow_ended}) {
    ::kill(c->pid(), SIGTERM);
    CHECK(c->Wait(20) == 0);
  }
}

TEST_CASE("follow: with trainwatchd down the reader pauses at the window and drops nothing",
          "[cli][follow]") {
  TempDir dir;
  auto d = std::make_unique<Trainwatchd>(dir, "", "");
  const std::string address = d->address();
  std::vector<std::string> argv = FollowArgs(dir.File("train.log"), "run-paused", *d,
                                             {"--max-in-flight", "1024"});
  d->Kill();
  d.reset();
  const std::string content = Llmc(0, 3000);
  std::ofstream(dir.File("train.log")) << content;
  // The smallest window, 1,024 records unacknowledged, checked every 256
  // records: the agent must hold the window and one check's worth, or the
  // oldest records would be dropped unsent while the server is away.
  Child follow(argv, dir.File("follow.log"));
  // The last status line's records in flight.
  auto in_flight = [&] {
    const std::string log = ReadFile(dir.File("follow.log"));
    const size_t at = log.rfind("in flight ");
    return at == std::string::npos ? 0 : std::atoi(log.c_str() + at + 10);
  };
  const bool at_window = WaitUntil([&] { return in_flight() >= 1024; }, std::chrono::seconds(15),
                                   std::chrono::milliseconds(20));
  INFO(ReadFile(dir.File("follow.log")));
  REQUIRE(at_window);
  // Paused there: no more than one check's worth past the window.
  CHECK_FALSE(WaitUntil([&] { return in_flight() > 1024 + 256; }, std::chrono::seconds(2),
                        std::chrono::milliseconds(50)));
  d = std::make_unique<Trainwatchd>(
      dir, "", "", std::vector<std::string>{"--listen", address});
  REQUIRE(WaitRows(d->db(), "run-paused", 3000));
  ::kill(follow.pid(), SIGTERM);
  const int rc = follow.Wait(20);
  INFO(ReadFile(dir.File("follow.log")));
  CHECK(rc == 0);
  CHECK(ReadFile(dir.File("follow.log")).find("lost") == std::string::npos);
  RequireSame(Stored(d->db(), "run-paused"), Replayed(content, MetricsFormat::kLlmc));
}

TEST_CASE("follow: steps going back open a new attempt resuming after the step before",
          "[cli][follow]") {
  TempDir dir;
  Trainwatchd d(dir, "", "");
  const std::string log = dir.File("train.log");
  const std::string content = Llmc(0, 30) + "saved ckpt step=19 at s3://b/ckpt-19\n" + Llmc(20, 50);
  std::ofstream(log) << content;
  Child follow(FollowArgs(log, "run-again", d,
                          {"--checkpoint-pattern", R"(saved ckpt step=(\d+) at (?<path>\S+))"}),
               dir.File("follow.log"));
  REQUIRE(WaitRows(d.db(), "run-again", 80));  // 30 + 20 copied + 30
  ::kill(follow.pid(), SIGTERM);
  const int rc = follow.Wait(20);
  INFO(ReadFile(dir.File("follow.log")));
  CHECK(rc == 0);
  RequireSame(Stored(d.db(), "run-again"), Replayed(content, MetricsFormat::kLlmc));
  CHECK(QueryInt(d.db(),
                 "SELECT from_step FROM attempts WHERE run_id = 'run-again' AND "
                 "attempt = 1") == 19);
  CHECK(QueryInt(d.db(),
                 "SELECT COUNT(*) FROM checkpoints WHERE run_id = 'run-again' AND step = "
                 "19 AND uri = 's3://b/ckpt-19'") == 1);
}

TEST_CASE("follow: a TensorBoard folder that grows is followed and a torn tail is waited for",
          "[cli][follow]") {
  using logs::testing::ScalarRecord;
  TempDir dir;
  Trainwatchd d(dir, "", "");
  const std::string tb = dir.File("tb");
  std::filesystem::create_directory(tb);
  const std::string file = tb + "/events.out.tfevents.1700000000.host.1.0";
  auto step = [](int64_t s) {
    return ScalarRecord(s, 1e9 + s, "train/loss", 2.0 + 0.01 * s) +
           ScalarRecord(s, 1e9 + s, "train/grad_norm", 0.5 + 0.001 * s);
  };
  std::string bytes = logs::testing::FileVersionRecord(1e9);
  for (int64_t s = 0; s < 10; ++s) bytes += step(s);
  const std::string s10 = step(10);
  Append(file, bytes + s10.substr(0, 7));  // step 10 torn inside its header
  Child follow(FollowArgs(tb, "run-tb", d), dir.File("follow.log"));
  // Step 9 is complete once step 10 begins: 0..8 are there, and no error.
  REQUIRE(WaitRows(d.db(), "run-tb", 9));
  CHECK(follow.running());
  Append(file, s10.substr(7) + step(11));
  REQUIRE(WaitRows(d.db(), "run-tb", 11));
  // A second file, as a trainer's next launch writes: its steps follow.
  Append(tb + "/events.out.tfevents.1700000100.host.1.0",
         logs::testing::FileVersionRecord(2e9) + step(12) + step(13));
  REQUIRE(WaitRows(d.db(), "run-tb", 13));
  ::kill(follow.pid(), SIGTERM);  // flushes step 13, held for more tags
  const int rc = follow.Wait(20);
  INFO(ReadFile(dir.File("follow.log")));
  CHECK(rc == 0);
  const std::vector<Row> rows = Stored(d.db(), "run-tb");
  REQUIRE(rows.size() == 14);
  for (int64_t s = 0; s < 14; ++s) {
    CHECK(rows[s].step == s);
    CHECK(rows[s].loss == Approx(2.0 + 0.01 * s).epsilon(1e-6));
    CHECK(rows[s].grad_norm == Approx(0.5 + 0.001 * s).epsilon(1e-6));
  }
}

TEST_CASE("follow: each framework's log piped on stdin is stored as replay reads it",
          "[cli][follow][formats]") {
  TempDir dir;
  Trainwatchd d(dir, "", "");
  const std::vector<std::tuple<std::string, std::string, MetricsFormat>> cases = {
      {"hf", "{'output_dir': 'out', 'logging_steps': 1}\n" + HfTrainer(1, 201),
       MetricsFormat::kHfTrainer},
      {"torchtitan", TorchTitan(1, 201), MetricsFormat::kTorchTitan},
      {"composer", "******\nConfig:\n******\n" + Composer(1, 201), MetricsFormat::kComposer},
      {"nemo", Nemo(1, 201), MetricsFormat::kNemo},
      {"lightning", LightningCsv(1, 201), MetricsFormat::kGenericCsv}};
  for (const auto& [name, content, format] : cases) {
    INFO(name);
    const std::string log = dir.File(name + ".log");
    std::ofstream(log) << content;
    const std::string run = "run-" + name;
    const std::string cmd = "exec '" TWCTL_PATH "' follow - --run " + run + " --server " +
                            d.address() + " --status-interval 0 < '" + log + "'";
    Child follow({"/bin/sh", "-c", cmd}, dir.File(name + ".out"));
    const int rc = follow.Wait(20);
    const std::string out = ReadFile(dir.File(name + ".out"));
    INFO(out);
    REQUIRE(rc == 0);
    CHECK(out.find("format " + std::string(FormatName(format))) != std::string::npos);
    std::vector<Row> expected = Replayed(content, format);
    if (format == MetricsFormat::kNemo) {
      for (Row& r : expected) r.grad_norm = 0;  // NeMo's line has none: stored as NULL
    }
    RequireSame(Stored(d.db(), run), expected);
    CHECK(Stored(d.db(), run).size() == 200);
  }
}

TEST_CASE("follow: records that share a step and sparse progress bars are stored as replay "
          "reads them",
          "[cli][follow][formats]") {
  TempDir dir;
  Trainwatchd d(dir, "", "");
  struct Case {
    std::string name, content;
    MetricsFormat format;
    int64_t logging_steps;
    size_t records;
    int64_t vocab = 0;  // --vocab, for follow and replay alike
  };
  for (const Case& c : {
           Case{"jsonl-train-val", logs::shapes::JsonLinesTrainVal(2000, 10, 100),
                MetricsFormat::kJsonLines, 0, 200},
           Case{"wandb-history", logs::shapes::WandbHistoryCsv(300), MetricsFormat::kGenericCsv,
                0, 300},
           Case{"hf-sparse-bars", logs::shapes::HfSparseBars(1700, 500, 250),
                MetricsFormat::kHfTrainer, 0, 1700},
           Case{"hf-sparse-bars-given", logs::shapes::HfSparseBars(1700, 500, 250),
                MetricsFormat::kHfTrainer, 1, 1700},
           Case{"finetune-exploding", logs::shapes::NanoGptFinetuneExploding(),
                MetricsFormat::kNanoGpt, 0, 41},
           Case{"finetune-exploding-vocab", logs::shapes::NanoGptFinetuneExploding(),
                MetricsFormat::kNanoGpt, 0, 41, 50257},
           Case{"sweep-point-diverging", logs::shapes::SweepPointDiverging(),
                MetricsFormat::kStepLog, 0, 600},
       }) {
    INFO(c.name);
    const std::string log = dir.File(c.name + ".log");
    std::ofstream(log) << c.content;
    const std::string run = "run-" + c.name;
    std::string cmd = "exec '" TWCTL_PATH "' follow - --run " + run + " --server " +
                      d.address() + " --status-interval 0";
    if (c.logging_steps > 0) cmd += " --logging-steps " + std::to_string(c.logging_steps);
    if (c.vocab > 0) cmd += " --vocab " + std::to_string(c.vocab);
    Child follow({"/bin/sh", "-c", cmd + " < '" + log + "'"}, dir.File(c.name + ".out"));
    const int rc = follow.Wait(20);
    const std::string out = ReadFile(dir.File(c.name + ".out"));
    INFO(out);
    REQUIRE(rc == 0);
    CHECK(out.find("format " + std::string(FormatName(c.format))) != std::string::npos);
    ReadOptions options;
    options.logging_steps = c.logging_steps;
    std::vector<Row> expected = Replayed(c.content, c.format, options);
    CHECK(expected.size() == c.records);
    for (Row& r : expected) {
      if (std::isnan(r.grad_norm)) r.grad_norm = 0;  // not in the log: stored as NULL
    }
    RequireSame(Stored(d.db(), run), expected);
    // And the same events: the server's engine judged the followed records
    // as replay's judges the file.
    options.format = c.format;
    absl::StatusOr<Trace> trace = ParseMetrics(c.content, "log", options);
    REQUIRE(trace.ok());
    core::RuleConfig rules;
    rules.vocab_size = c.vocab;
    absl::StatusOr<logs::ReplayResult> replayed = logs::Replay(*trace, rules);
    REQUIRE(replayed.ok());
    std::vector<std::pair<int64_t, int64_t>> want;
    for (const core::Event& e : replayed->events) want.emplace_back(e.step, e.tier);
    CHECK(StoredEvents(d.db(), run) == want);
    if (c.name == "finetune-exploding") CHECK(want == decltype(want){{130, 2}});
    if (c.name == "sweep-point-diverging") {
      // The warm-up's divergence page, 700 steps before the warm-up ends.
      REQUIRE_FALSE(want.empty());
      CHECK(want.back().second == 2);
      CHECK(want.back().first > 300);
      CHECK(want.back().first < 500);
    }
    if (c.name == "finetune-exploding-vocab") {
      REQUIRE_FALSE(want.empty());
      CHECK(want.front() == std::make_pair(int64_t{110}, int64_t{3}));
    }
  }
  SECTION("a line at the step just sent waits for the next line - then merges") {
    // Followed as it is written: the train line, a pause longer than the
    // poll, the val line, then the next step. The record of step 10 is sent
    // once (when the log goes quiet), with the train line's loss.
    const std::string path = dir.File("live.jsonl");
    std::ofstream(path) << "";
    Child follow({TWCTL_PATH, "follow", path, "--run", "run-live", "--server", d.address(),
                  "--status-interval", "0", "--poll-interval", "20"},
                 dir.File("live.out"));
    auto append = [&](const std::string& text) {
      std::ofstream(path, std::ios::app) << text << std::flush;
    };
    append("{\"step\": 10, \"train_loss\": 2.5}\n");
    REQUIRE(WaitRows(d.db(), "run-live", 1));
    append("{\"step\": 10, \"val_loss\": 2.7}\n{\"step\": 20, \"train_loss\": 2.4}\n");
    REQUIRE(WaitRows(d.db(), "run-live", 2));
    const std::vector<Row> rows = Stored(d.db(), "run-live");
    REQUIRE(rows.size() == 2);
    CHECK(rows[0].step == 10);
    CHECK(rows[0].loss == 2.5);
    CHECK(rows[0].attempt == 0);
    CHECK(rows[1].step == 20);
    CHECK(rows[1].attempt == 0);
    // A metric of step 20 written after its record went: said, not sent,
    // and no restart.
    append("{\"step\": 20, \"grad_norm\": 1.5}\n{\"step\": 30, \"train_loss\": 2.3}\n");
    REQUIRE(WaitRows(d.db(), "run-live", 3));
    CHECK(Stored(d.db(), "run-live").back().attempt == 0);
    const std::string note =
        "live.jsonl:4: more of step 20, written after that step's record was sent (the log was "
        "quiet between them): its grad_norm not sent";
    CHECK(WaitUntil(
        [&] { return ReadFile(dir.File("live.out")).find(note) != std::string::npos; },
        std::chrono::seconds(10), std::chrono::milliseconds(20)));
  }
}

// An excerpt in tests/data/formats (see its README), found from this file's
// folder: the follow test's binary is not given that folder's path.
std::string FormatsFile(const std::string& name) {
  return (std::filesystem::path(__FILE__).parent_path().parent_path() / "data" / "formats" / name)
      .string();
}

TEST_CASE("follow: the real excerpts piped on stdin are stored as replay reads them",
          "[cli][follow][formats]") {
  TempDir dir;
  Trainwatchd d(dir, "", "");
  const std::vector<std::pair<std::string, MetricsFormat>> files = {
      {"hf-trainer-state-bart-samsum.json", MetricsFormat::kHfTrainerState},
      {"hf-trainer-state-whisper-ja.json", MetricsFormat::kHfTrainerState},
      {"lightning-arcroute-metrics.csv", MetricsFormat::kGenericCsv},
      {"composer-dyna-console.log", MetricsFormat::kComposer},
      {"composer-llm-foundry-readme.log", MetricsFormat::kComposer}};
  for (const auto& [name, format] : files) {
    INFO(name);
    const std::string path = FormatsFile(name);
    const std::string content = ReadFile(path);
    REQUIRE_FALSE(content.empty());
    const std::string run = "run-" + name.substr(0, name.find('.'));
    const std::string cmd = "exec '" TWCTL_PATH "' follow - --run " + run + " --server " +
                            d.address() + " --status-interval 0 < '" + path + "'";
    Child follow({"/bin/sh", "-c", cmd}, dir.File(run + ".out"));
    const int rc = follow.Wait(20);
    const std::string out = ReadFile(dir.File(run + ".out"));
    INFO(out);
    REQUIRE(rc == 0);
    CHECK(out.find("format " + std::string(FormatName(format))) != std::string::npos);
    std::vector<Row> expected = Replayed(content, format);
    for (Row& r : expected) {
      if (std::isnan(r.grad_norm)) r.grad_norm = 0;  // not in the file: stored as NULL
    }
    RequireSame(Stored(d.db(), run), expected);
  }
}

TEST_CASE("follow: a followed log's NaN is the server's halt recommended - no divergence - a "
          "suggestion that works",
          "[cli][follow]") {
  TempDir dir;
  Trainwatchd d(dir, "", "");
  // A real run whose loss is NaN from step 1200 on (tests/data/realdata).
  const std::string path = (std::filesystem::path(__FILE__).parent_path().parent_path() / "data" /
                            "realdata" / "parameter-golf-behemoth-v10.log")
                               .string();
  const std::string cmd = "exec '" TWCTL_PATH "' follow - --run run-nan --server " + d.address() +
                          " --status-interval 0 < '" + path + "'";
  Child follow({"/bin/sh", "-c", cmd}, dir.File("follow.out"));
  REQUIRE(follow.Wait(20) == 0);
  Child status({TWCTL_PATH, "--server", d.address(), "-o", "json", "status", "run-nan"},
               dir.File("status.json"));
  REQUIRE(status.Wait(20) == 0);
  std::string json = ReadFile(dir.File("status.json"));
  json.erase(std::remove_if(json.begin(), json.end(), ::isspace), json.end());
  INFO(json);
  // The server's engine found the numerical failure (its halt, recommended:
  // the run is observed); no agent decided anything, so nothing diverged
  // from it. Before, each step from the NaN on counted one.
  CHECK(json.find("\"rule\":\"RULE_NONFINITE_METRIC\"") != std::string::npos);
  CHECK(json.find("\"observed\":true") != std::string::npos);
  CHECK(json.find("\"decision_divergences\":\"0\"") != std::string::npos);
  CHECK(json.find("\"agent_decisions\":\"0\"") != std::string::npos);
  // The run reported no checkpoint: incident show suggests no approval
  // (it would be refused) but says why and what works, and that works.
  Child show({TWCTL_PATH, "--server", d.address(), "incident", "show", "I-1"},
             dir.File("show.txt"));
  REQUIRE(show.Wait(20) == 0);
  const std::string shown = ReadFile(dir.File("show.txt"));
  INFO(shown);
  CHECK(shown.find("approve with") == std::string::npos);
  CHECK(shown.find("no rollback can be approved: trainwatchd keeps no checkpoint of run run-nan "
                   "from before step 1200") != std::string::npos);
  const std::string suggested = "twctl rollback reject I-1 --comment \"...\"";
  REQUIRE(shown.find(suggested) != std::string::npos);
  Child reject({TWCTL_PATH, "--server", d.address(), "rollback", "reject", "I-1", "--comment",
                "no checkpoint: restarted by hand"},
               dir.File("reject.txt"));
  CHECK(reject.Wait(20) == 0);
  INFO(ReadFile(dir.File("reject.txt")));
  CHECK(QueryInt(d.db(), "SELECT count(*) FROM incidents WHERE closed_ms > 0") == 1);
}

TEST_CASE("follow: a Hugging Face log without bars takes --logging-steps", "[cli][follow]") {
  TempDir dir;
  Trainwatchd d(dir, "", "");
  const std::string content =
      "{'loss': 2.5, 'grad_norm': 1.0, 'learning_rate': 1e-4, 'epoch': 0.1}\n"
      "{'loss': 2.4, 'grad_norm': 0.9, 'learning_rate': 1e-4, 'epoch': 0.2}\n";
  std::ofstream(dir.File("train.log")) << content;
  const std::string cmd = "exec '" TWCTL_PATH
                          "' follow - --run run-ls --logging-steps 25 "
                          "--server " +
                          d.address() + " < '" + dir.File("train.log") + "'";
  Child follow({"/bin/sh", "-c", cmd}, dir.File("follow.log"));
  const int rc = follow.Wait(20);
  INFO(ReadFile(dir.File("follow.log")));
  CHECK(rc == 0);
  const std::vector<Row> rows = Stored(d.db(), "run-ls");
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].step == 25);
  CHECK(rows[1].step == 50);
}

TEST_CASE("follow: trainer_state.json rewritten at each save sends each step once",
          "[cli][follow][hf-state]") {
  TempDir dir;
  Trainwatchd d(dir, "", "");
  const std::string state = dir.File("trainer_state.json");  // not there yet: waited for
  Child follow(FollowArgs(state, "run-state", d), dir.File("follow.log"));
  // HF opens it with "w" and writes the new, longer document: truncated
  // and written in place, which looks like an append to a tail.
  auto rewrite = [&](int64_t last) { std::ofstream(state, std::ios::trunc) << TrainerState(last); };
  rewrite(100);
  REQUIRE(WaitRows(d.db(), "run-state", 10));
  rewrite(250);
  REQUIRE(WaitRows(d.db(), "run-state", 25));
  // Rewritten with nothing new (a save without a log since): nothing sent.
  rewrite(250);
  rewrite(400);
  REQUIRE(WaitRows(d.db(), "run-state", 40));
  ::kill(follow.pid(), SIGTERM);
  const int rc = follow.Wait(20);
  const std::string out = ReadFile(dir.File("follow.log"));
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("format hf-state") != std::string::npos);
  CHECK(out.find("attempts 1,") != std::string::npos);  // no step sent twice: no restart
  RequireSame(Stored(d.db(), "run-state"), Replayed(TrainerState(400), MetricsFormat::kAuto));

  // On standard input, one version: detected by its "log_history" key.
  std::ofstream(dir.File("state.json")) << TrainerState(100);
  const std::string cmd = "exec '" TWCTL_PATH "' follow - --run run-state-pipe --server " +
                          d.address() + " < '" + dir.File("state.json") + "'";
  Child pipe({"/bin/sh", "-c", cmd}, dir.File("pipe.log"));
  const int pipe_rc = pipe.Wait(20);
  INFO(ReadFile(dir.File("pipe.log")));
  CHECK(pipe_rc == 0);
  CHECK(ReadFile(dir.File("pipe.log")).find("format hf-state") != std::string::npos);
  CHECK(Stored(d.db(), "run-state-pipe").size() == 10);
}

TEST_CASE("follow: a Trainer's output folder is followed through its newest trainer_state.json",
          "[cli][follow][hf-state]") {
  TempDir dir;
  Trainwatchd d(dir, "", "");
  const std::string out_dir = dir.File("output");
  std::filesystem::create_directory(out_dir);
  Child follow(FollowArgs(out_dir, "run-ckpt", d, {"--format", "hf-state"}),
               dir.File("follow.log"));
  // Each save writes checkpoint-N/trainer_state.json; the end, the
  // folder's own.
  auto save = [&](const std::string& folder, int64_t last) {
    std::filesystem::create_directories(folder);
    std::ofstream(folder + "/trainer_state.json") << TrainerState(last);
  };
  save(out_dir + "/checkpoint-100", 100);
  REQUIRE(WaitRows(d.db(), "run-ckpt", 10));
  save(out_dir + "/checkpoint-200", 200);
  REQUIRE(WaitRows(d.db(), "run-ckpt", 20));
  save(out_dir, 230);
  REQUIRE(WaitRows(d.db(), "run-ckpt", 23));
  ::kill(follow.pid(), SIGTERM);
  const int rc = follow.Wait(20);
  const std::string out = ReadFile(dir.File("follow.log"));
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("attempts 1,") != std::string::npos);
  RequireSame(Stored(d.db(), "run-ckpt"), Replayed(TrainerState(230), MetricsFormat::kAuto));
}

TEST_CASE("follow: a Lightning metrics.csv rewritten with a new column sends each step once",
          "[cli][follow][lightning]") {
  TempDir dir;
  Trainwatchd d(dir, "", "");
  const std::string csv = dir.File("metrics.csv");
  Child follow(FollowArgs(csv, "run-csv", d), dir.File("follow.log"));
  // CSVLogger appends rows while the header holds every key; the first
  // validation metric makes it write the whole file again with the new
  // column, longer than before.
  std::string rows;
  for (int s = 1; s <= 50; ++s)
    rows += "0," + std::to_string(s) + "," + std::to_string(3.0 - 0.01 * s) + "\n";
  std::ofstream(csv) << "epoch,step,train_loss\n" << rows;
  REQUIRE(WaitRows(d.db(), "run-csv", 50));
  std::string wide = "epoch,step,train_loss,val_loss\n";
  for (int s = 1; s <= 100; ++s) {
    wide += "0," + std::to_string(s) + "," + std::to_string(3.0 - 0.01 * s) + ",\n";
    if (s == 50) wide += "0,50,,2.5\n";
  }
  std::ofstream(csv, std::ios::trunc) << wide;
  const bool all = WaitRows(d.db(), "run-csv", 100);
  INFO(ReadFile(dir.File("follow.log")));
  REQUIRE(all);
  ::kill(follow.pid(), SIGTERM);
  const int rc = follow.Wait(20);
  const std::string out = ReadFile(dir.File("follow.log"));
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("rewritten") != std::string::npos);
  CHECK(out.find("attempts 1,") != std::string::npos);
  std::vector<Row> expected = Replayed(wide, MetricsFormat::kGenericCsv);
  for (Row& r : expected) r.grad_norm = 0;  // no grad norm column: stored as NULL
  RequireSame(Stored(d.db(), "run-csv"), expected);
}

TEST_CASE("follow: a Composer block is sent once the log goes quiet - not at the next block",
          "[cli][follow][composer]") {
  TempDir dir;
  Trainwatchd d(dir, "", "");
  const std::string log = dir.File("train.log");
  Child follow(FollowArgs(log, "run-composer", d), dir.File("follow.log"));
  Append(log, Composer(1, 11));
  REQUIRE(WaitRows(d.db(), "run-composer", 10));  // block 10 too: nothing after it
  Append(log, Composer(11, 21));
  REQUIRE(WaitRows(d.db(), "run-composer", 20));
  ::kill(follow.pid(), SIGTERM);
  const int rc = follow.Wait(20);
  INFO(ReadFile(dir.File("follow.log")));
  CHECK(rc == 0);
  RequireSame(Stored(d.db(), "run-composer"), Replayed(Composer(1, 21), MetricsFormat::kComposer));
}

TEST_CASE("follow: a malformed line is named and read past and the exit says so", "[cli][follow]") {
  TempDir dir;
  Trainwatchd d(dir, "", "");
  const std::string content = Llmc(0, 5) + "s:5 trl:garbage lr:0.1 norm:1\n" + Llmc(6, 10);
  std::ofstream(dir.File("train.log")) << content;
  const std::string cmd = "exec '" TWCTL_PATH "' follow - --run run-bad --server " + d.address() +
                          " < '" + dir.File("train.log") + "'";
  Child follow({"/bin/sh", "-c", cmd}, dir.File("follow.log"));
  const int rc = follow.Wait(20);
  const std::string out = ReadFile(dir.File("follow.log"));
  INFO(out);
  CHECK(rc == 2);
  CHECK(out.find("<stdin>:6:") != std::string::npos);
  CHECK(out.find("\"garbage\" is not a number") != std::string::npos);
  CHECK(Stored(d.db(), "run-bad").size() == 9);
}

// A script's own print format, as a user's small training loop writes it:
// a clock, padded step/total, '|' separated metrics.
std::string Bracketed(int64_t from, int64_t to) {
  std::string out = "using device cpu, 1.2M parameters\n";
  for (int64_t s = from; s < to; ++s) {
    out += absl::StrFormat("[11:%02d:%02d] step %5d/%d | loss %.4f | gnorm %.3f | lr %.1e | %.1fs\n",
                           s / 60 % 60, s % 60, s, to, 4.5 / (1 + s * 0.01),
                           0.9 + 0.001 * s, 3e-3, s * 0.1);
  }
  return out;
}

TEST_CASE("follow: --pattern reads a print format no reader knows - as replay --pattern does",
          "[cli][follow][formats]") {
  TempDir dir;
  Trainwatchd d(dir, "", "");
  const std::string content = Bracketed(0, 200);
  const std::string log = dir.File("train.log");
  std::ofstream(log) << content;
  const std::vector<std::pair<std::string, std::string>> patterns = {
      {"template", "step {step}/{} | loss {loss} | gnorm {grad_norm} | lr {lr}"},
      {"regex", R"(step\s+(?<step>\d+)/\d+ \| loss (?<loss>\S+) \| gnorm (?P<grad_norm>\S+))"}};
  for (const auto& [name, pattern] : patterns) {
    INFO(name);
    const std::string run = "run-" + name;
    Child follow({TWCTL_PATH, "follow", log, "--run", run, "--server", d.address(),
                  "--status-interval", "0", "--pattern", pattern},
                 dir.File(name + ".out"));
    // A file is followed until stopped: stop once every step is stored.
    REQUIRE(WaitRows(d.db(), run, 200));
    ::kill(follow.pid(), SIGTERM);
    REQUIRE(follow.Wait(20) == 0);
    const std::string out = ReadFile(dir.File(name + ".out"));
    INFO(out);
    CHECK(out.find("format pattern") != std::string::npos);
    ReadOptions read;
    absl::StatusOr<std::shared_ptr<const logs::LinePattern>> p = logs::LinePattern::Compile(pattern);
    REQUIRE(p.ok());
    read.pattern = *p;
    const std::vector<Row> stored = Stored(d.db(), run);
    RequireSame(stored, Replayed(content, MetricsFormat::kPattern, read));
    CHECK(stored[10].grad_norm == Approx(0.910));
  }
}

TEST_CASE("follow: a format no reader knows stops with the formats tried - nothing guessed",
          "[cli][follow][formats]") {
  TempDir dir;
  Trainwatchd d(dir, "", "");
  std::ofstream(dir.File("train.log")) << Bracketed(0, 40);
  const std::string cmd = "exec '" TWCTL_PATH "' follow - --run run-unknown --server " +
                          d.address() + " --status-interval 0 < '" + dir.File("train.log") + "'";
  Child follow({"/bin/sh", "-c", cmd}, dir.File("follow.log"));
  const int rc = follow.Wait(20);
  const std::string out = ReadFile(dir.File("follow.log"));
  INFO(out);
  CHECK(rc == 2);
  CHECK(out.find("no known format in its first lines (tried: Hugging Face Trainer,") !=
        std::string::npos);
  CHECK(out.find("a line: \"[11:00:00] step     0/40 | loss 4.5000") != std::string::npos);
  CHECK(out.find("--pattern") != std::string::npos);
  CHECK(out.find("format unknown") != std::string::npos);
  CHECK(out.find("source ended") == std::string::npos);
  CHECK(Stored(d.db(), "run-unknown").empty());
}

TEST_CASE("follow: 500 lines in no known format stop a live source - a rewrite before them does not",
          "[cli][follow][formats]") {
  TempDir dir;
  Trainwatchd d(dir, "", "");
  // A pipe that stays open (a FIFO its writer holds): the bound, not the end
  // of the input, stops it.
  std::string unknown;
  for (int i = 0; i < 600; ++i) unknown += absl::StrFormat("[11:00:%02d] tick %d\n", i % 60, i);
  std::ofstream(dir.File("unknown.log")) << unknown;
  const std::string fifo = dir.File("pipe");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  Child writer({"/bin/sh", "-c", "cat '" + dir.File("unknown.log") + "' > '" + fifo +
                                     "'; sleep 60 > '" + fifo + "'"},
               dir.File("writer.out"));
  Child bound({"/bin/sh", "-c", "exec '" TWCTL_PATH "' follow - --run run-bound --server " +
                                    d.address() + " --status-interval 0 < '" + fifo + "'"},
              dir.File("bound.out"));
  const int rc = bound.Wait(30);
  const std::string out = ReadFile(dir.File("bound.out"));
  INFO(out);
  CHECK(rc == 2);
  CHECK(out.find("still looking for a known format after 50 lines") != std::string::npos);
  CHECK(out.find("no known format in its first lines") != std::string::npos);

  // A log rotated before its first metric line (a job that restarted) is
  // followed on: its new content is llm.c's.
  const std::string log = dir.File("train.log");
  std::ofstream(log) << "starting\nloading data\n";
  Child follow({TWCTL_PATH, "follow", log, "--run", "run-rewrite", "--server", d.address(),
                "--status-interval", "0"},
               dir.File("rewrite.out"));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  std::ofstream(log + ".new") << Llmc(0, 30);
  std::filesystem::rename(log + ".new", log);
  REQUIRE(WaitRows(d.db(), "run-rewrite", 30));
  ::kill(follow.pid(), SIGTERM);
  CHECK(follow.Wait(20) == 0);
}

TEST_CASE("follow: bad flags are usage errors naming them", "[cli][follow]") {
  TempDir dir;
  auto run = [&](std::vector<std::string> argv) {
    argv.insert(argv.begin(), {TWCTL_PATH, "follow"});
    Child c(argv, dir.File("out.log"));
    const int rc = c.Wait(10);  // before the read: make_pair's arguments are unordered
    return std::make_pair(rc, ReadFile(dir.File("out.log")));
  };
  auto [rc1, out1] = run({"-", "--run", "x", "--checkpoint-pattern", "saved at step"});
  CHECK(rc1 == 2);
  CHECK(out1.find("no capture group for the step") != std::string::npos);
  auto [rc2, out2] = run({"-"});
  CHECK(rc2 == 2);
  CHECK(out2.find("--run RUN is required") != std::string::npos);
  auto [rc3, out3] = run({"-", "--run", "x", "--max-in-flight", "3"});
  CHECK(rc3 == 2);
  CHECK(out3.find("--max-in-flight") != std::string::npos);
  auto [rc4, out4] = run({"-", "--run", "x", "--pattern", "step {step} gnorm {gnorm}"});
  CHECK(rc4 == 2);
  CHECK(out4.find("unknown field \"gnorm\"") != std::string::npos);
  auto [rc5, out5] = run({"-", "--run", "x", "--pattern", "step {step} loss {loss}", "--format",
                          "llmc"});
  CHECK(rc5 == 2);
  CHECK(out5.find("give --pattern or --format, not both") != std::string::npos);
}

}  // namespace
}  // namespace trainwatch::cli
