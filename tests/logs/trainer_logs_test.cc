// nanoGPT's log and DeepSpeed's loss-scaler lines: each reader on a real
// excerpt (tests/data/formats, see its README), on its malformed cases, read
// whole (replay) and a line at a time with a flush at the end (follow), and
// on damaged input, which must give a clear error or a trace, never a crash.

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "trainwatch/logs/metrics_file.h"
#include "trainwatch/logs/replay.h"
#include "logs/excerpts.h"

namespace trainwatch::logs {
namespace {

using core::Signal;

absl::StatusOr<Trace> Parse(absl::string_view content, MetricsFormat f = MetricsFormat::kAuto) {
  ReadOptions o;
  o.format = f;
  return ParseMetrics(content, "run.log", o);
}

std::string ErrorOf(absl::string_view content, MetricsFormat f = MetricsFormat::kAuto) {
  auto t = Parse(content, f);
  REQUIRE_FALSE(t.ok());
  return std::string(t.status().message());
}

ReplayResult ReplayOf(const Trace& t) {
  auto r = Replay(t, core::RuleConfig());
  REQUIRE(r.ok());
  return *std::move(r);
}

TEST_CASE("nanoGPT: iter lines with and without a timestamp - eval read past - checkpoint",
          "[logs][formats][nanogpt]") {
  SECTION("timestamped (karpathy/nanoGPT#215)") {
    auto t = Parse(Excerpt("nanogpt-fp16-nan.log"));
    REQUIRE(t.ok());
    CHECK(t->format() == MetricsFormat::kNanoGpt);
    REQUIRE(t->size() == 15);  // 15 iter lines; the eval line is not a record
    CHECK(t->Record(0).step == 2920);
    CHECK(t->Record(0).Get(Signal::kLoss) == 3.9883);
    CHECK_FALSE(t->Record(0).Has(Signal::kGradNorm));
    // "step 3000: train loss ..., val loss ..." then "saving checkpoint to
    // out": a checkpoint at step 3000, carried by iter 3000's record.
    const core::StepRecord r3000 = t->Record(8);
    CHECK(r3000.step == 3000);
    CHECK(r3000.Get(Signal::kLoss) == 4.2490);
    CHECK(r3000.checkpoint_uri == "out");
    CHECK(t->Record(9).step == 3010);
    CHECK(std::isnan(t->Record(9).Get(Signal::kLoss)));
    CHECK(t->Record(9).checkpoint_uri.empty());
    // The halt recommends the checkpoint the log announced.
    const ReplayResult r = ReplayOf(*t);
    auto halt = std::find_if(r.events.begin(), r.events.end(),
                             [](const core::Event& e) { return e.tier == 3; });
    REQUIRE(halt != r.events.end());
    CHECK(halt->recommended_checkpoint_step == 3000);
    CHECK(halt->recommended_checkpoint_uri == "out");
  }
  SECTION("no timestamp (karpathy/nanoGPT#178)") {
    auto t = Parse(Excerpt("nanogpt-shakespeare.log"));
    REQUIRE(t.ok());
    CHECK(t->format() == MetricsFormat::kNanoGpt);
    REQUIRE(t->size() == 25);
    CHECK(t->Record(0).step == 0);
    CHECK(t->Record(0).Get(Signal::kLoss) == 4.2648);
    CHECK(t->Record(24).step == 240);
    CHECK(ReplayOf(*t).halted_at == -1);
  }
  SECTION("forks: an lr field, a timestamp with milliseconds, no mfu") {
    auto t = Parse(
        "2024-01-02 03:04:05,123 iter 7: loss 2.5000, time 12.00ms, lr 6.000000e-04, mfu "
        "1.00%\niter 8: loss 2.4000, time 561.94ms\n");
    REQUIRE(t.ok());
    REQUIRE(t->size() == 2);
    CHECK(t->Record(0).Get(Signal::kLearningRate) == 6e-4);
    CHECK(t->Record(1).Get(Signal::kLoss) == 2.4);
  }
  SECTION("a checkpoint whose eval step has no iter line is a record of its own") {
    auto t = Parse(
        "iter 240: loss 1.6524, time 895.31ms, mfu 16.62%\nstep 250: train loss 1.5440, val "
        "loss 1.7220\nsaving checkpoint to out-shakespeare-char\niter 260: loss 1.6, time "
        "895.31ms, mfu 16.62%\n");
    REQUIRE(t.ok());
    REQUIRE(t->size() == 3);
    CHECK(t->Record(1).step == 250);
    CHECK(t->Record(1).checkpoint_uri == "out-shakespeare-char");
    CHECK_FALSE(t->Record(1).Has(Signal::kLoss));
    // ... and after the last iter line, at the end.
    auto end = Parse("iter 240: loss 1.6, time 1ms\nstep 250: train loss 1.5, val loss 1.7\n"
                     "saving checkpoint to out\n");
    REQUIRE(end.ok());
    REQUIRE(end->size() == 2);
    CHECK(end->Record(1).step == 250);
    CHECK(end->Record(1).checkpoint_uri == "out");
  }
}

TEST_CASE("nanoGPT: malformed lines name line and column", "[logs][formats][nanogpt]") {
  CHECK(ErrorOf("iter 0: loss 4.2, time 1ms\niter 10: loss 4.x, time 1ms\n") ==
        "run.log:2:15: loss \"4.x\" is not a number");
  // Iteration 10 again with another loss: a restart there, kept apart.
  CHECK(Parse("2023-03-22 09:30:39 iter 10: loss 4.0, time 1ms\n"
              "2023-03-22 09:30:50 iter 10: loss 3.9, time 1ms\n")
            ->size() == 2);
  CHECK(ErrorOf("iter 99999999999999999999: loss 4.2, time 1ms\n", MetricsFormat::kNanoGpt) ==
        "run.log:1:6: iteration number out of range");
  CHECK(ErrorOf("step 250: train loss 1.5, val loss 1.7\n", MetricsFormat::kNanoGpt) ==
        "run.log:1:1: no nanoGPT \"iter N: loss X\" lines: nothing to replay");
}

TEST_CASE("DeepSpeed alone: start-up overflows are skipped steps at their scale",
          "[logs][formats][deepspeed]") {
  // deepspeedai/DeepSpeed#931: a hysteresis line, then three halvings.
  auto t = Parse(Excerpt("deepspeed-startup-overflows.log"));
  REQUIRE(t.ok());
  CHECK(t->format() == MetricsFormat::kDeepSpeed);
  REQUIRE(t->size() == 4);
  const double scales[] = {65536, 65536, 32768, 16384};
  for (size_t i = 0; i < 4; ++i) {
    const core::StepRecord r = t->Record(i);
    CHECK(r.step == static_cast<int64_t>(i) + 1);
    CHECK(r.loss_scale_overflow());
    CHECK(r.loss_scale() == scales[i]);
  }
  // Overflows the scaler recovers from: one tier 0 record, no halt.
  const ReplayResult r = ReplayOf(*t);
  CHECK(r.halted_at == -1);
  REQUIRE(r.events.size() == 1);
  CHECK(r.events[0].tier == 0);
  CHECK(r.events[0].kind == core::EventKind::kLossScaleOverflow);
}

TEST_CASE("DeepSpeed: already at minimum is a tier 3 failure",
          "[logs][formats][deepspeed]") {
  // ymcui/Chinese-LLaMA-Alpaca#534: overflows from scale 64 down, sharing
  // lines with tqdm bars, then the exception.
  // A Hugging Face Trainer log: its bars place the overflows (framework_logs_test.cc).
  auto t = Parse(Excerpt("hf-deepspeed-min-scale.log"));
  REQUIRE(t.ok());
  CHECK(t->format() == MetricsFormat::kHfTrainer);
  REQUIRE(t->size() == 6);
  CHECK(t->Record(0).loss_scale() == 64);
  CHECK(t->Record(4).loss_scale() == 4);
  CHECK(t->Record(5).loss_scale() == 0);  // no scale left
  const ReplayResult r = ReplayOf(*t);
  CHECK(r.halted_at == t->Record(5).step);
  auto halt = std::find_if(r.events.begin(), r.events.end(),
                           [](const core::Event& e) { return e.tier == 3; });
  REQUIRE(halt != r.events.end());
  CHECK(halt->kind == core::EventKind::kLossScaleCollapse);

  // Every rank raises it: one failure however many ranks print it.
  auto twice = Parse(
      "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1, reducing to 1\n"
      "Exception: Current loss scale already at minimum - cannot decrease scale anymore.\n"
      "Exception: Current loss scale already at minimum - cannot decrease scale anymore.\n");
  REQUIRE(twice.ok());
  CHECK(twice->size() == 2);
}

TEST_CASE("DeepSpeed lines inside a trainer's log: the trainer's steps place them",
          "[logs][formats][deepspeed]") {
  SECTION("Megatron-DeepSpeed: overflows after iteration 10 are steps 11 and 12") {
    const std::string log =
        " iteration       10/  500000 | learning rate: 1.5E-04 | lm loss: 7.1E+00 | grad norm: "
        "2.3 |\n"
        "[2023-04-28 06:51:30,648] [INFO] [loss_scaler.py:181:update_scale] [deepspeed] "
        "OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768\n"
        "[2023-04-28 06:51:31,392] [INFO] [loss_scaler.py:181:update_scale] [deepspeed] "
        "OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 32768.0, reducing to 16384.0\n"
        "[2023-07-25 21:02:01,160] [INFO] [logging.py:96:log_dist] [Rank 0] step=12, "
        "skipped=2, lr=[9.934597234870435e-07, 9.934597234870435e-07], mom=[[0.9, 0.95], "
        "[0.9, 0.95]]\n"
        " iteration       20/  500000 | learning rate: 1.5E-04 | lm loss: 6.9E+00 | grad norm: "
        "2.1 |\n";
    auto t = Parse(log);
    REQUIRE(t.ok());
    CHECK(t->format() == MetricsFormat::kMegatron);
    REQUIRE(t->size() == 4);
    CHECK(t->Record(0).step == 10);
    CHECK_FALSE(t->Record(0).HasLossScale());
    CHECK(t->Record(1).step == 11);
    CHECK(t->Record(1).loss_scale() == 65536);
    CHECK(t->Record(2).step == 12);
    CHECK(t->Record(2).loss_scale() == 32768);
    CHECK_FALSE(t->Record(2).Has(Signal::kLoss));  // DeepSpeed's step=12 adds no record
    CHECK(t->Record(3).step == 20);
    CHECK(t->Record(3).Get(Signal::kLoss) == Approx(6.9));
    CHECK_FALSE(t->Record(3).HasLossScale());
  }
  SECTION("nanoGPT: an overflow at a step the trainer logs is one record") {
    // The overflow comes while step 11 runs; nanoGPT then logs iter 11.
    auto t = Parse(
        "iter 10: loss 4.2, time 1ms\n"
        "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 128, reducing to 64\n"
        "iter 11: loss 4.1, time 1ms\n");
    REQUIRE(t.ok());
    CHECK(t->format() == MetricsFormat::kNanoGpt);
    REQUIRE(t->size() == 2);
    CHECK(t->Record(1).step == 11);
    CHECK(t->Record(1).Get(Signal::kLoss) == 4.1);
    CHECK(t->Record(1).loss_scale_overflow());
    CHECK(t->Record(1).loss_scale() == 128);
  }
  SECTION("the trainer found among the first lines though DeepSpeed's come first") {
    auto t = Parse(
        "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to "
        "32768\n"
        "iter 1: loss 4.2, time 1ms\n");
    REQUIRE(t.ok());
    CHECK(t->format() == MetricsFormat::kNanoGpt);
    REQUIRE(t->size() == 1);  // the overflow at step 1 rides on iter 1's record
    CHECK(t->Record(0).loss_scale() == 65536);
  }
}

TEST_CASE("DeepSpeed alone: step=N lines are records with their learning rate",
          "[logs][formats][deepspeed]") {
  auto t = Parse(
      "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to "
      "32768\n"
      "[INFO] [logging.py:96:log_dist] [Rank 0] step=10, skipped=1, lr=[0.0001, 0.0001], "
      "mom=[(0.9, 0.999)]\n"
      "epoch=0/micro_step=16/global_step=16, RunningAvgSamplesPerSec=7.9\n"
      "[Rank 0] step=20, skipped=1, lr=[0.0002], mom=[(0.9, 0.999)]\n");
  REQUIRE(t.ok());
  CHECK(t->format() == MetricsFormat::kDeepSpeed);
  REQUIRE(t->size() == 3);
  CHECK(t->Record(0).step == 1);
  CHECK(t->Record(1).step == 10);
  CHECK(t->Record(1).Get(Signal::kLearningRate) == 0.0001);
  CHECK_FALSE(t->Record(1).HasLossScale());
  CHECK(t->Record(2).step == 20);
  CHECK(t->Record(2).Get(Signal::kLearningRate) == 0.0002);
}

TEST_CASE("DeepSpeed: malformed lines name line and column", "[logs][formats][deepspeed]") {
  CHECK(ErrorOf("[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 6x5, "
                "reducing to 32768\n") ==
        "run.log:1:67: loss scale \"6x5\" is not a number >= 0");
  CHECK(ErrorOf("[Rank 0] step=10, skipped=1, lr=[abc], mom=[(0.9, 0.999)]\n") ==
        "run.log:1:34: lr \"abc\" is not a number");
  CHECK(ErrorOf("[Rank 0] step=99999999999999999999, skipped=1, lr=[0.1]\n") ==
        "run.log:1:15: step number out of range");
  CHECK(ErrorOf("nothing here\n", MetricsFormat::kDeepSpeed) ==
        "run.log:1:1: no DeepSpeed loss-scale lines (OVERFLOW!, step=N, skipped=K): nothing "
        "to replay");
}

TEST_CASE("format names: nanogpt and deepspeed round-trip", "[logs][formats]") {
  for (MetricsFormat f : {MetricsFormat::kNanoGpt, MetricsFormat::kDeepSpeed}) {
    MetricsFormat back;
    REQUIRE(ParseFormatName(FormatName(f), &back));
    CHECK(back == f);
  }
}

// Damaged copies of every excerpt (excerpts.h).
TEST_CASE("the new readers never crash on damaged input", "[logs][formats][robustness]") {
  CheckDamagedCopies({"nanogpt-fp16-nan.log", "nanogpt-shakespeare.log",
                      "megatron-deepspeed-silent-nan.log", "deepspeed-startup-overflows.log",
                      "hf-deepspeed-min-scale.log"},
                     {MetricsFormat::kAuto, MetricsFormat::kNanoGpt, MetricsFormat::kDeepSpeed,
                      MetricsFormat::kMegatron},
                     ReadOptions(), 7, 5);
}

}  // namespace
}  // namespace trainwatch::logs
