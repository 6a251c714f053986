// The metrics reader: both formats, unknown vs NaN, and every malformed case
// naming file, line and column.

#include <cmath>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "trainwatch/logs/metrics_file.h"

namespace trainwatch::logs {
namespace {

using core::Signal;

std::string ErrorOf(absl::string_view content, MetricsFormat f = MetricsFormat::kAuto) {
  ReadOptions o;
  o.format = f;
  auto t = ParseMetrics(content, "run.csv", o);
  REQUIRE_FALSE(t.ok());
  CHECK(t.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(t.status().message());
}

TEST_CASE("CSV: columns in any order - optional columns - quoted fields", "[logs][csv]") {
  auto t = ParseMetrics(
      "nan_frac,step,loss,log_z,grad_norm,shard,checkpoint,lr,extra\r\n"
      "0,1,2.5,8.0,1.0,7;8,,3e-4,x\n"
      "\n"
      "0,2,nan,8.1,1.1,9,\"ckpt://a,b\",3e-4,y\n"
      "0,3,2.4,,inf,,,,z\n",
      "run.csv");
  REQUIRE(t.ok());
  REQUIRE(t->size() == 3);
  const auto r0 = t->Record(0);
  CHECK(r0.step == 1);
  CHECK(r0.Get(Signal::kLoss) == 2.5);
  CHECK(r0.Get(Signal::kLearningRate) == 3e-4);
  CHECK(std::vector<uint64_t>(r0.shards.begin(), r0.shards.end()) == std::vector<uint64_t>{7, 8});
  CHECK(r0.checkpoint_uri.empty());
  const auto r1 = t->Record(1);
  CHECK(r1.Has(Signal::kLoss));
  CHECK(std::isnan(r1.Get(Signal::kLoss)));  // reported NaN: a signal
  CHECK(r1.checkpoint_uri == "ckpt://a,b");
  const auto r2 = t->Record(2);
  CHECK_FALSE(r2.Has(Signal::kLogZ));  // empty cell: unknown at this step
  CHECK(std::isinf(r2.Get(Signal::kGradNorm)));
  CHECK_FALSE(r2.Has(Signal::kLearningRate));
  CHECK(t->line(2) == 5);
}

TEST_CASE("a metric the file never writes is unknown but a written nan is reported",
          "[logs][csv][missing]") {
  // log_z: an empty cell on every row, never written; grad_norm: written,
  // as nan on every row, which is a report (nonfinite_test.cc replays it).
  auto t = ParseMetrics("step,loss,grad_norm,log_z,nan_frac\n1,2.5,nan,,0\n2,2.4,nan,,0\n",
                        "run.csv");
  REQUIRE(t.ok());
  CHECK(t->Record(0).Has(Signal::kGradNorm));
  CHECK(std::isnan(t->Record(0).Get(Signal::kGradNorm)));
  CHECK_FALSE(t->Record(1).Has(Signal::kLogZ));
  CHECK(t->Record(1).Has(Signal::kNanFrac));
  CHECK(t->reported() == (core::Bit(Signal::kLoss) | core::Bit(Signal::kGradNorm) |
                          core::Bit(Signal::kNanFrac)));
}

TEST_CASE("CSV: malformed input names file - line and column", "[logs][csv][errors]") {
  CHECK(ErrorOf("") ==
        "run.csv:1:1: empty file: expected a CSV header, JSON lines, or a trainer's log (llm.c, "
        "step:S/N, Megatron-LM, nanoGPT, DeepSpeed, Hugging Face, torchtitan, Composer, NeMo)");
  CHECK(ErrorOf("step,loss,grad_norm,log_z,nan_frac\n") ==
        "run.csv:1:1: no records: the file holds no step");
  // Strict (--format csv): trainwatch's own CSV needs all five columns.
  CHECK(ErrorOf("step,loss,log_z\n1,2,3\n", MetricsFormat::kCsv) ==
        "run.csv:1:1: header lacks the columns grad_norm, nan_frac (expected step, loss, "
        "grad_norm, log_z, nan_frac)");
  CHECK(ErrorOf("step,loss,grad_norm,log_z,nan_frac\n1,2.5,1.0,8,0\n2,2.5x,1.0,8,0\n") ==
        "run.csv:3:3: loss \"2.5x\" is not a number");
  // A row written twice is one record (same_step_test.cc).
  CHECK(ParseMetrics("step,loss,grad_norm,log_z,nan_frac\n1,2.5,1.0,8,0\n1,2.5,1.0,8,0\n", "run.csv")
            ->size() == 1);
  // A step going back is a restart logging into the same file: kept, in file
  // order, for Replay() to open a new attempt.
  auto back = ParseMetrics("step,loss,grad_norm,log_z,nan_frac\n5,2.5,1.0,8,0\n4,2.5,1.0,8,0\n",
                           "run.csv");
  REQUIRE(back.ok());
  REQUIRE(back->size() == 2);
  CHECK(back->Record(1).step == 4);
  CHECK(ErrorOf("step,loss,grad_norm,log_z,nan_frac\n1.5,2.5,1.0,8,0\n") ==
        "run.csv:2:1: step \"1.5\" is not an integer");
  CHECK(ErrorOf("step,loss,grad_norm,log_z,nan_frac\n1,2.5,1.0,8\n") ==
        "run.csv:2:1: 4 fields, but the header names 5 columns");
  CHECK(ErrorOf("step,loss,grad_norm,log_z,nan_frac,shard\n1,2.5,1.0,8,0,3;99999999999999999999\n") ==
        "run.csv:2:17: shard id \"99999999999999999999\" does not fit in 64 bits");
  CHECK(ErrorOf("step,loss,loss,grad_norm,log_z,nan_frac\n") ==
        "run.csv:1:11: column \"loss\" is a second loss column");
  CHECK(ErrorOf("loss,grad_norm\n2,1\n") ==
        "run.csv:1:1: no step column in the header (step, _step, global_step or iteration)");
  CHECK(ErrorOf("step,loss,grad_norm,log_z,nan_frac,checkpoint\n1,2,1,8,0,\"abc\n") ==
        "run.csv:2:11: unterminated quoted field");
  CHECK(ErrorOf("step,loss,grad_norm,log_z,nan_frac\n-3,2.5,1.0,8,0\n") ==
        "run.csv:2:1: step must be >= 0");
}

TEST_CASE("JSON lines: the same keys - null as unknown - shard forms", "[logs][jsonl]") {
  auto t = ParseMetrics(
      "{\"step\": 1, \"loss\": 2.5, \"grad_norm\": 1.0, \"log_z\": null, \"nan_frac\": 0, "
      "\"shard\": [4, 5]}\n"
      "{\"step\": 2, \"loss\": NaN, \"grad_norm\": 1.1, \"log_z\": 8, \"nan_frac\": 0, "
      "\"shard\": \"6;7\", \"checkpoint\": \"ckpt://2\"}\n"
      "{\"step\": 3, \"loss\": \"inf\", \"grad_norm\": 1.2, \"nan_frac\": 0, \"shard\": 9, "
      "\"other\": {\"x\": 1}}\n",
      "run.jsonl");
  REQUIRE(t.ok());
  REQUIRE(t->size() == 3);
  CHECK_FALSE(t->Record(0).Has(Signal::kLogZ));
  CHECK(t->Record(0).shards.size() == 2);
  CHECK(std::isnan(t->Record(1).Get(Signal::kLoss)));
  CHECK(t->Record(1).checkpoint_uri == "ckpt://2");
  CHECK(t->Record(1).shards[1] == 7);
  CHECK(std::isinf(t->Record(2).Get(Signal::kLoss)));
  CHECK(t->Record(2).shards[0] == 9);
}

TEST_CASE("JSON lines: comment lines are read past - a metric no line has is unknown",
          "[logs][jsonl]") {
  // What twctl follow reads, replay reads: no log_z or nan_frac key anywhere.
  auto t = ParseMetrics(
      "# written by my_train.py\n"
      "{\"step\": 1, \"loss\": 2.5, \"grad_norm\": 1.0}\n"
      "  # a comment between records\n"
      "{\"step\": 2, \"loss\": 2.4}\n",
      "run.jsonl", ReadOptions());
  REQUIRE(t.ok());
  REQUIRE(t->size() == 2);
  CHECK(t->Record(0).Get(Signal::kLoss) == 2.5);
  CHECK(t->Record(0).Get(Signal::kGradNorm) == 1.0);
  CHECK_FALSE(t->Record(0).Has(Signal::kLogZ));
  CHECK_FALSE(t->Record(1).Has(Signal::kGradNorm));
  CHECK_FALSE(t->Record(1).Has(Signal::kNanFrac));
}

TEST_CASE("JSON lines: the keys loggers write - the metric-name table - own names first",
          "[logs][jsonl]") {
  // A logger's keys: _step, train/loss, train/grad_norm, learning_rate; a
  // line with both loss and train_loss takes loss.
  auto t = ParseMetrics(
      "{\"_step\": 10, \"train/loss\": 2.5, \"train/grad_norm\": 1.5, \"learning_rate\": 3e-4}\n"
      "{\"global_step\": 20, \"train_loss\": 2.25, \"loss\": 2.0, \"lr\": 1e-4}\n",
      "run.jsonl");
  REQUIRE(t.ok());
  REQUIRE(t->size() == 2);
  CHECK(t->Record(0).step == 10);
  CHECK(t->Record(0).Get(Signal::kLoss) == 2.5);
  CHECK(t->Record(0).Get(Signal::kGradNorm) == 1.5);
  CHECK(t->Record(0).Get(Signal::kLearningRate) == 3e-4);
  CHECK(t->Record(1).step == 20);
  CHECK(t->Record(1).Get(Signal::kLoss) == 2.0);
  CHECK(t->Record(1).Get(Signal::kLearningRate) == 1e-4);
}

TEST_CASE("JSON lines: malformed input names file - line and column", "[logs][jsonl][errors]") {
  const std::string ok = R"({"step": 1, "loss": 2, "grad_norm": 1, "log_z": 8, "nan_frac": 0})";
  CHECK(ErrorOf(ok + "\n{\"step\": 2, \"loss\": 2,, }\n") ==
        "run.csv:2:23: expected a quoted key");
  CHECK(ErrorOf(ok + "\n{\"loss\": 2}\n") ==
        "run.csv:2:1: missing a step key (step, _step, global_step, iteration, iter, "
        "trainer/global_step or train/step)");
  CHECK(ErrorOf(ok + "\n{\"step\": 2, \"train/loss\": 2, \"train_loss\": 3}\n") ==
        "run.csv:2:44: \"train/loss\" and \"train_loss\" both name the loss; keep one, or name "
        "it \"loss\"");
  CHECK(ErrorOf(ok + "\n{\"step\": 2, \"loss\": \"abc\"}\n") ==
        "run.csv:2:21: loss \"abc\" is not a number");
  CHECK(ParseMetrics(ok + "\n" + ok + "\n", "run.csv")->size() == 1);  // written twice: one record
  CHECK(ErrorOf("{\"step\": 1, \"train_lss\": 2, \"lr\": 0.1}\n") ==
        "run.csv:1:1: no line has a loss (its keys: train_lss, lr); expected loss, and "
        "grad_norm, log_z, nan_frac where known");
  CHECK(ErrorOf(ok + "\n[1,2]\n", MetricsFormat::kJsonLines) ==
        "run.csv:2:1: each line must be a JSON object");
  CHECK(ErrorOf(ok + "\n{\"step\": 2, \"shard\": [-1]}\n") ==
        "run.csv:2:23: shard ids must be non-negative integers or names (strings)");
  CHECK(ErrorOf(ok + "\n{\"step\": 2, \"shard\": [\"\"]}\n") ==
        "run.csv:2:23: shard: a shard name is empty");
}

TEST_CASE("CSV shard column: names beside ids - several per row", "[logs][csv][shards]") {
  auto t = ParseMetrics(
      "step,loss,grad_norm,log_z,nan_frac,shard\n"
      "1,2.5,1.0,8,0,shard-00500:0\n"
      "2,2.5,1.0,8,0,7; train-00012-of-01024.parquet:3 ;s3://b/k-1.tar\n"
      "3,2.5,1.0,8,0,12\n",
      "run.csv");
  REQUIRE(t.ok());
  const core::StepRecord r0 = t->Record(0), r1 = t->Record(1), r2 = t->Record(2);
  CHECK(r0.shards.empty());
  REQUIRE(r0.shard_names.size() == 1);
  CHECK(r0.shard_names[0] == "shard-00500:0");
  REQUIRE(r1.shards.size() == 1);
  CHECK(r1.shards[0] == 7);
  REQUIRE(r1.shard_names.size() == 2);
  CHECK(r1.shard_names[0] == "train-00012-of-01024.parquet:3");
  CHECK(r1.shard_names[1] == "s3://b/k-1.tar");
  CHECK(r2.shard_names.empty());
  CHECK(r2.shards[0] == 12);
}

TEST_CASE("shard names past the bounds are refused naming the bound", "[logs][csv][shards]") {
  const std::string head = "step,loss,grad_norm,log_z,nan_frac,shard\n1,2.5,1.0,8,0,";
  CHECK(ErrorOf(head + std::string(257, 'n') + "\n") ==
        "run.csv:2:15: shard: shard name \"" + std::string(32, 'n') +
            "...\" is 257 bytes, above the 256 a shard name may have");
  CHECK(ParseMetrics(head + std::string(256, 'n') + "\n", "run.csv").ok());
  std::string many;
  for (int i = 0; i <= 1024; ++i) many += "n" + std::to_string(i) + ";";
  const std::string err = ErrorOf(head + many + "\n");
  CHECK(err.find("1025 shard names, above the 1024 a record may carry") != std::string::npos);
}

TEST_CASE("JSON lines: shard lists mix ids and names", "[logs][jsonl][shards]") {
  auto t = ParseMetrics(
      "{\"step\": 1, \"loss\": 2.5, \"grad_norm\": 1.0, \"log_z\": 8, \"nan_frac\": 0, "
      "\"shard\": [4, \"a;b,c\", \"7\", 18446744073709551615]}\n"
      "{\"step\": 2, \"loss\": 2.5, \"grad_norm\": 1.0, \"log_z\": 8, \"nan_frac\": 0, "
      "\"shard\": \"shard-00500:0;9\"}\n",
      "run.jsonl");
  REQUIRE(t.ok());
  const core::StepRecord r0 = t->Record(0), r1 = t->Record(1);
  // In a list a string is a name as it is, even "7" or one holding ';'.
  CHECK(std::vector<uint64_t>(r0.shards.begin(), r0.shards.end()) ==
        std::vector<uint64_t>{4, 18446744073709551615u});
  CHECK(std::vector<std::string>(r0.shard_names.begin(), r0.shard_names.end()) ==
        std::vector<std::string>{"a;b,c", "7"});
  // A string value is the CSV's list.
  CHECK(std::vector<std::string>(r1.shard_names.begin(), r1.shard_names.end()) ==
        std::vector<std::string>{"shard-00500:0"});
  CHECK(r1.shards[0] == 9);
}

TEST_CASE("ReadMetricsFile reports a missing file", "[logs]") {
  auto t = ReadMetricsFile("/nonexistent/run.csv");
  REQUIRE_FALSE(t.ok());
  CHECK(t.status().code() == absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace trainwatch::logs
