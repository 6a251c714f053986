// Records that share a step, and Hugging Face logs whose bars are sparse
// (tests/logs/shapes.h writes each shape as its trainer or logger does):
// rows at one step are one record, another value of a metric at that step is
// a restart there, never an overwrite, and bars anchor the step without
// fighting the dict count.

#include <catch2/catch.hpp>
#include <cmath>
#include <string>

#include "logs/shapes.h"
#include "trainwatch/logs/metrics_file.h"
#include "trainwatch/logs/replay.h"

namespace trainwatch::logs {
namespace {

using core::Signal;

absl::StatusOr<Trace> Parse(const std::string& content, int64_t logging_steps = 0) {
  ReadOptions o;
  o.logging_steps = logging_steps;
  return ParseMetrics(content, "run.log", o);
}

// Every record's step is `first + i * every` and its values are the shapes'
// functions of that step: nothing shifted, lost or taken from an eval line.
void CheckSteps(const Trace& t, int64_t first, int64_t every, int64_t count) {
  REQUIRE(t.size() == static_cast<size_t>(count));
  for (size_t i = 0; i < t.size(); ++i) {
    const core::StepRecord r = t.Record(i);
    const int64_t want = first + static_cast<int64_t>(i) * every;
    INFO("record " << i);
    REQUIRE(r.step == want);
    CHECK(r.Get(Signal::kLoss) == Approx(shapes::Loss(want)).epsilon(1e-4));
    CHECK(r.Get(Signal::kGradNorm) == Approx(shapes::GradNorm(want)).epsilon(1e-4));
  }
}

TEST_CASE("same step: a JSON-lines logger's train and val lines are one record",
          "[logs][same-step]") {
  auto t = Parse(shapes::JsonLinesTrainVal(2000, 10, 100));
  REQUIRE(t.ok());
  CHECK(t->format() == MetricsFormat::kJsonLines);
  CheckSteps(*t, 10, 10, 200);
  CHECK(t->Record(9).Get(Signal::kLearningRate) == 0.0003);
}

TEST_CASE("same step: W&B's history rows at one _step merge into one record",
          "[logs][same-step]") {
  auto t = Parse(shapes::WandbHistoryCsv(300));
  REQUIRE(t.ok());
  CheckSteps(*t, 1, 1, 300);
}

TEST_CASE("same step: another value of a metric at the step is a restart there - kept",
          "[logs][same-step]") {
  // A line every rank printed is one record; a second loss at step 20 is
  // the job running step 20 again: two attempts, both losses kept.
  const std::string log =
      "{\"step\": 10, \"loss\": 2.5, \"shard\": \"a\"}\n{\"step\": 10, \"loss\": 2.5, \"grad_norm\": "
      "1.0, \"shard\": \"b\"}\n{\"step\": 20, \"loss\": 2.4}\n{\"step\": 20, \"loss\": 2.45}\n"
      "{\"step\": 30, \"loss\": 2.3}\n";
  auto t = Parse(log);
  REQUIRE(t.ok());
  REQUIRE(t->size() == 4);
  const core::StepRecord first = t->Record(0);
  CHECK(first.step == 10);
  CHECK(first.Get(Signal::kGradNorm) == 1.0);
  REQUIRE(first.shard_names.size() == 2);  // both lines' shards
  CHECK(first.shard_names[0] == "a");
  CHECK(first.shard_names[1] == "b");
  CHECK(t->Record(1).Get(Signal::kLoss) == 2.4);
  CHECK(t->Record(2).step == 20);
  CHECK(t->Record(2).Get(Signal::kLoss) == 2.45);
  absl::StatusOr<ReplayResult> r = Replay(*t, core::RuleConfig());
  REQUIRE(r.ok());
  REQUIRE(r->attempts.size() == 2);
  CHECK(r->attempts[1].resumed_from == 19);
  CHECK(r->records == 4);
}

TEST_CASE("sparse bars: Hugging Face dicts every step with a bar every 500 - with or without "
          "--logging-steps",
          "[logs][same-step][hf]") {
  const std::string log = shapes::HfSparseBars(1700, 500, 250);
  for (int64_t given : {1, 0}) {
    INFO("--logging-steps " << given);
    auto t = Parse(log, given);
    REQUIRE(t.ok());
    CHECK(t->format() == MetricsFormat::kHfTrainer);
    CheckSteps(*t, 1, 1, 1700);  // without the option, learned from the first bar
    CHECK(t->warnings().empty());
  }
}

TEST_CASE("sparse bars: where the bar and the dict count disagree the bar wins - with a note",
          "[logs][same-step][hf]") {
  // The run logs every 2 steps; the user gave --logging-steps 1. The count
  // puts the 250th dict at step 250; the bar drawn after it says 500: the
  // next dict is taken at the bar's step, with a note.
  std::string every2;
  char line[200];
  for (int64_t s = 2; s <= 1200; s += 2) {
    std::snprintf(line, sizeof line, "{'loss': %.4f, 'grad_norm': %.4f}\n", shapes::Loss(s),
                  shapes::GradNorm(s));
    every2 += line;
    if (s % 500 == 0) {
      std::snprintf(line, sizeof line, "\r  5%%|#    | %lld/10000 [00:10<15:00, 9.80it/s]",
                    static_cast<long long>(s));
      every2 += line;
    }
  }
  auto t = Parse(every2, 1);
  REQUIRE(t.ok());
  REQUIRE_FALSE(t->warnings().empty());
  CHECK(t->warnings()[0].find("the bar's step is taken") != std::string::npos);
  CHECK(t->warnings()[0].find("run.log:251:") == 0);
  CHECK(t->Record(249).step == 250);
  CHECK(t->Record(250).step == 500);
  // Without the option the bars say it: 250 dicts up to step 500 are 2 apart.
  auto learned = Parse(every2, 0);
  REQUIRE(learned.ok());
  CHECK(learned->warnings().empty());
  CheckSteps(*learned, 2, 2, 600);
}

TEST_CASE("sparse bars: NeMo 1's bars each a record at their step - shortened global_step",
          "[logs][same-step][nemo]") {
  // Lightning's bar as NeMo 1 draws it, reaching the file every 100 steps
  // (each bar ends its physical line when another message prints): N/T,
  // then the postfix with tqdm's format_num, which shortens global_step to
  // three significant digits past 999 ("1.1e+3").
  std::string log;
  char line[400];
  for (int n = 100; n <= 2000; n += 100) {
    const int step = n - 1;
    char gs[32];
    std::snprintf(gs, sizeof gs, "%.3g", static_cast<double>(step));
    std::string g = gs;
    if (g.find("e+0") != std::string::npos) g.replace(g.find("e+0"), 3, "e+");
    if (g.find('e') == std::string::npos && g.find('.') == std::string::npos) g += ".0";
    std::snprintf(line, sizeof line,
                  "Epoch 0:  %d%%|#         | %d/20000 [10:00<90:00, 1.00it/s, loss=3.1, v_num=, "
                  "reduced_train_loss=%.3f, global_step=%s, consumed_samples=%d.0]\n"
                  "[NeMo I 2024-01-01 00:00:00 nemo_logging:349] a message\n",
                  n / 200, n, shapes::Loss(step), g.c_str(), step * 8);
    log += line;
  }
  auto t = Parse(log);
  REQUIRE(t.ok());
  CHECK(t->format() == MetricsFormat::kNemo);
  REQUIRE(t->size() == 20);
  for (size_t i = 0; i < t->size(); ++i) {
    INFO("record " << i);
    CHECK(t->Record(i).step == 99 + 100 * static_cast<int64_t>(i));
    CHECK(t->Record(i).Get(Signal::kLoss) ==
          Approx(shapes::Loss(99 + 100 * static_cast<int64_t>(i))).epsilon(1e-3));
  }
}

}  // namespace
}  // namespace trainwatch::logs
