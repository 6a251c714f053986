// The trainers' own log formats: each parser on small inputs of its own,
// including its malformed cases, and format detection.

#include <cmath>
#include <string>

#include <catch2/catch.hpp>

#include "trainwatch/logs/metrics_file.h"

namespace trainwatch::logs {
namespace {

using core::Signal;

absl::StatusOr<Trace> Parse(absl::string_view content, MetricsFormat f = MetricsFormat::kAuto,
                            ColumnMap map = {}) {
  ReadOptions o;
  o.format = f;
  o.column_map = std::move(map);
  return ParseMetrics(content, "run.log", o);
}

std::string ErrorOf(absl::string_view content, MetricsFormat f = MetricsFormat::kAuto,
                    ColumnMap map = {}) {
  auto t = Parse(content, f, std::move(map));
  REQUIRE_FALSE(t.ok());
  return std::string(t.status().message());
}

TEST_CASE("llm.c main.log: train lines become records and tel lines are read past",
          "[logs][formats][llmc]") {
  auto t = Parse(
      "starting run\n"
      "s:0 tel:11.0095\n"
      "s:0 trl:11.0116 lr:0.000001 norm:14.96\n"
      "s:1 trl:10.9586 lr:0.000002 norm:15.18\n"
      "s:250 tel:6.1565\n"
      "s:250 trl:6.2 lr:0.0006 norm:nan\n");
  REQUIRE(t.ok());
  CHECK(t->format() == MetricsFormat::kLlmc);
  REQUIRE(t->size() == 3);
  const auto r = t->Record(1);
  CHECK(r.step == 1);
  CHECK(r.Get(Signal::kLoss) == 10.9586);
  CHECK(r.Get(Signal::kGradNorm) == 15.18);
  CHECK(r.Get(Signal::kLearningRate) == 0.000002);
  CHECK_FALSE(r.Has(Signal::kLogZ));
  CHECK_FALSE(r.Has(Signal::kNanFrac));
  CHECK(std::isnan(t->Record(2).Get(Signal::kGradNorm)));  // a reported NaN: a signal
  CHECK(t->Record(2).Has(Signal::kGradNorm));
}

TEST_CASE("llm.c main.log: malformed lines name line and column", "[logs][formats][llmc]") {
  CHECK(ErrorOf("s:0 trl:11.0 lr:1e-6 norm:1\ns:1 trl:abc lr:1e-6 norm:1\n") ==
        "run.log:2:9: trl \"abc\" is not a number");
  CHECK(ErrorOf("s:0 trl:11.0\ns:x trl:10\n", MetricsFormat::kLlmc) ==
        "run.log:2:3: step \"x\" is not a non-negative integer");
  CHECK(Parse("s:5 trl:11.0\ns:4 trl:10\n", MetricsFormat::kAuto, {})->Record(1).step ==
        4);  // going back: a restart in the same file
  CHECK(ErrorOf("s:0 tel:11\n") == "run.log:1:1: no llm.c \"s:STEP trl:LOSS\" lines: nothing to "
                                   "replay");
}

TEST_CASE("step:S/N logs: train_loss lines only - val lines read past - nan kept",
          "[logs][formats][steplog]") {
  auto t = Parse(
      "step:0/20 val_loss:22.6 train_time:278ms step_avg:nanms\n"
      "step:1/20 train_loss:22.62 train_time:81991ms step_avg:nanms\n"
      "step:2/20 train_loss:9.59 val_bpb:4.1 seq_len:128 train_time:83639ms\n"
      "step:50/20 train_loss:nan train_time:90000ms tok/s:4256012\n"
      "step:50/20 val_loss:nan val_bpb:nan\n");
  REQUIRE(t.ok());
  CHECK(t->format() == MetricsFormat::kStepLog);
  REQUIRE(t->size() == 3);
  CHECK(t->Record(0).step == 1);
  CHECK(t->Record(1).Get(Signal::kLoss) == 9.59);
  CHECK(t->Record(2).step == 50);
  CHECK(std::isnan(t->Record(2).Get(Signal::kLoss)));
  CHECK_FALSE(t->Record(0).Has(Signal::kGradNorm));
  // A never-finite metric is unknown, but a loss that turns NaN is a signal:
  // the finite losses before it make loss a reported metric.
  CHECK((t->reported() & core::Bit(Signal::kLoss)) != 0);
}

TEST_CASE("step:S/N logs: malformed lines", "[logs][formats][steplog]") {
  CHECK(ErrorOf("step:1/10 train_loss:2.5\nstep:2/10 train_loss:2.5x\n") ==
        "run.log:2:22: train_loss \"2.5x\" is not a number");
  // Step 1 again with another loss is a restart there, kept apart; with the
  // same loss it is one record (a line every rank printed).
  auto again = Parse("step:1/10 train_loss:2.5\nstep:1/10 train_loss:2.4\n");
  REQUIRE(again.ok());
  CHECK(again->size() == 2);
  auto same = Parse("step:1/10 train_loss:2.5\nstep:1/10 train_loss:2.5\n");
  REQUIRE(same.ok());
  CHECK(same->size() == 1);
  CHECK(ErrorOf("step:-4/10 train_loss:2.5\n", MetricsFormat::kStepLog) ==
        "run.log:1:6: step \"-4/10\" is not a non-negative integer");
}

TEST_CASE("Megatron-LM iteration lines", "[logs][formats][megatron]") {
  const std::string log =
      "using world size: 8\n"
      " [2024-05-01 10:00:00] iteration      100/  500000 | consumed samples:      12800 | "
      "elapsed time per iteration (ms): 1234.5 | learning rate: 1.500000E-04 | global batch "
      "size:   128 | lm loss: 7.123456E+00 | loss scale: 1.0 | grad norm: 2.345 | number of "
      "skipped iterations:   0 | number of nan iterations:   0 |\n"
      " [2024-05-01 10:01:00] iteration      200/  500000 | consumed samples:      25600 | "
      "learning rate: 1.499000E-04 | lm loss: 6.9E+00 | grad norm: 2.1 | number of skipped "
      "iterations:   1 | number of nan iterations:   3 |\n";
  auto t = Parse(log);
  REQUIRE(t.ok());
  CHECK(t->format() == MetricsFormat::kMegatron);
  REQUIRE(t->size() == 2);
  CHECK(t->Record(0).step == 100);
  CHECK(t->Record(0).Get(Signal::kLoss) == Approx(7.123456));
  CHECK(t->Record(0).Get(Signal::kGradNorm) == 2.345);
  CHECK(t->Record(0).Get(Signal::kLearningRate) == 1.5e-4);
  CHECK(t->Record(0).Get(Signal::kNanFrac) == 0.0);
  CHECK(t->Record(1).Get(Signal::kNanFrac) == Approx(0.03));  // 3 of the 100 iterations

  CHECK(ErrorOf(" iteration 100/ 500 | lm loss: 7.1.2 | grad norm: 1 |\n") ==
        "run.log:1:32: lm loss \"7.1.2\" is not a number");
  CHECK(Parse(" iteration 100/ 500 | lm loss: 7 |\n iteration 50/ 500 | lm loss: 7 |\n",
              MetricsFormat::kAuto, {})
            ->Record(1)
            .step == 50);  // going back: a restart in the same file
}

TEST_CASE("W&B and TensorBoard CSV exports with --map", "[logs][formats][csv]") {
  SECTION("W&B: usual names are found, absent metrics are unknown, sparse rows read past") {
    auto t = Parse(
        "Step,train/loss,train/grad_norm,train/loss__MIN,eval/loss\n"
        "100,2.5,1.1,2.4,\n"
        "150,,,,2.9\n"
        "200.0,2.4,1.0,2.3,\n");
    REQUIRE(t.ok());
    CHECK(t->format() == MetricsFormat::kGenericCsv);
    REQUIRE(t->size() == 2);
    CHECK(t->Record(1).step == 200);
    CHECK(t->Record(1).Get(Signal::kLoss) == 2.4);
    CHECK(t->Record(0).Get(Signal::kGradNorm) == 1.1);
    CHECK_FALSE(t->Record(0).Has(Signal::kLogZ));
    CHECK_FALSE(t->Record(0).Has(Signal::kNanFrac));
  }
  SECTION("--map picks the columns") {
    auto map = ParseColumnMap("loss=my/lm_loss, grad_norm=my/gn");
    REQUIRE(map.ok());
    auto t = Parse("_step,my/lm_loss,my/gn,loss\n1,3.0,0.5,9\n2,2.9,0.6,9\n",
                   MetricsFormat::kAuto, *map);
    REQUIRE(t.ok());
    CHECK(t->Record(1).Get(Signal::kLoss) == 2.9);  // not the unmapped "loss" column
    CHECK(t->Record(1).Get(Signal::kGradNorm) == 0.6);
  }
  SECTION("TensorBoard's Wall time,Step,Value") {
    auto map = ParseColumnMap("loss=Value");
    REQUIRE(map.ok());
    auto t = Parse("Wall time,Step,Value\n1700000000.5,10,3.25\n1700000001.5,20,3.2\n",
                   MetricsFormat::kAuto, *map);
    REQUIRE(t.ok());
    CHECK(t->Record(0).step == 10);
    CHECK(t->Record(0).Get(Signal::kLoss) == 3.25);
    CHECK(ErrorOf("Wall time,Step,Value\n1.5,10,3.25\n") ==
          "run.log:1:1: no loss column in the header (its columns: Wall time, Step, Value); "
          "name it with --map, e.g. --map loss=train/loss (the names read without it: "
          "docs/log-formats.md)");
  }
  SECTION("malformed") {
    auto map = ParseColumnMap("loss=nope");
    REQUIRE(map.ok());
    CHECK(ErrorOf("step,train/loss\n1,2\n", MetricsFormat::kAuto, *map) ==
          "run.log:1:1: --map names column \"nope\", which the header does not have");
    CHECK(ErrorOf("step,train/loss\n1,2\n2,x2\n") == "run.log:3:3: loss \"x2\" is not a number");
    CHECK(Parse("step,train/loss\n2,2\n1,2\n", MetricsFormat::kAuto, {})->Record(1).step ==
          1);  // going back: a restart in the same file
    CHECK_FALSE(ParseColumnMap("loss").ok());
    CHECK_FALSE(ParseColumnMap("lossy=a").ok());
    CHECK_FALSE(ParseColumnMap("loss=a,loss=b").ok());
  }
}

TEST_CASE("format names round-trip and --format forces a reader", "[logs][formats]") {
  for (MetricsFormat f : {MetricsFormat::kAuto, MetricsFormat::kCsv, MetricsFormat::kGenericCsv,
                          MetricsFormat::kJsonLines, MetricsFormat::kLlmc,
                          MetricsFormat::kStepLog, MetricsFormat::kMegatron}) {
    MetricsFormat back;
    REQUIRE(ParseFormatName(FormatName(f), &back));
    CHECK(back == f);
  }
  MetricsFormat x;
  CHECK_FALSE(ParseFormatName("yaml", &x));
  // Forced llm.c on a step log finds no llm.c lines.
  CHECK(ErrorOf("step:1/10 train_loss:2.5\n", MetricsFormat::kLlmc).find("no llm.c") !=
        std::string::npos);
}

}  // namespace
}  // namespace trainwatch::logs
