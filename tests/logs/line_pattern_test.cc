// --pattern (logs/line_pattern.h): templates and named-group regexes as a
// user writes them for their own print format, their errors, and the
// detection error that points to them.

#include "trainwatch/logs/line_pattern.h"

#include <cmath>
#include <string>

#include <catch2/catch.hpp>

#include "trainwatch/logs/metrics_file.h"

namespace trainwatch::logs {
namespace {

using core::Signal;

absl::StatusOr<Trace> ParseWith(absl::string_view content, absl::string_view pattern) {
  absl::StatusOr<std::shared_ptr<const LinePattern>> p = LinePattern::Compile(pattern);
  if (!p.ok()) return p.status();
  ReadOptions o;
  o.format = MetricsFormat::kPattern;
  o.pattern = *p;
  return ParseMetrics(content, "train.log", o);
}

std::string CompileError(absl::string_view pattern) {
  absl::StatusOr<std::shared_ptr<const LinePattern>> p = LinePattern::Compile(pattern);
  REQUIRE_FALSE(p.ok());
  return std::string(p.status().message());
}

constexpr absl::string_view kLog =
    "model: 1.2M parameters, lr=3e-3\n"
    "[11:44:07] step     0/400 | loss 4.5836 | gnorm 0.950 | lr 3.0e-03 | 0.0s\n"
    "[11:44:07] eval step 0 | val 4.61\n"
    "[11:44:08] step     1/400 | loss 4.4012 | gnorm 1.2e+00 | lr 3.0e-03 | 0.1s\n"
    "[11:44:09] step     2/400 | loss nan | gnorm inf | lr 3.0e-03 | 0.2s\n"
    "[11:44:10] step     3/400 | loss -inf | gnorm .5 | lr 3e-3 | 0.3s\n";

void CheckRecords(const Trace& t) {
  REQUIRE(t.size() == 4);
  CHECK(t.format() == MetricsFormat::kPattern);
  CHECK(t.Record(0).step == 0);
  CHECK(t.Record(0).Get(Signal::kLoss) == 4.5836);
  CHECK(t.Record(1).Get(Signal::kGradNorm) == 1.2);
  CHECK(std::isnan(t.Record(2).Get(Signal::kLoss)));
  CHECK(std::isinf(t.Record(2).Get(Signal::kGradNorm)));
  CHECK(t.Record(3).Get(Signal::kLoss) == -INFINITY);
  CHECK(t.Record(3).Get(Signal::kGradNorm) == 0.5);
  CHECK(t.Record(3).step == 3);
  CHECK(t.line(3) == 6);
}

TEST_CASE("pattern: a template reads the bracketed print format - eval lines read past",
          "[logs][pattern]") {
  auto t = ParseWith(kLog, "step {step}/{} | loss {loss} | gnorm {grad_norm} | lr {lr}");
  REQUIRE(t.ok());
  CheckRecords(*t);
  CHECK(t->Record(0).Get(Signal::kLearningRate) == 3e-3);
  // A metric no field names is unknown for the run.
  CHECK_FALSE(t->Record(0).Has(Signal::kLogZ));
}

TEST_CASE("pattern: a regex with named groups reads the same records", "[logs][pattern]") {
  // Both spellings of a named group; an alias (train_loss) for the loss.
  auto t = ParseWith(kLog, R"(step\s+(?<step>\d+)/\d+ \| loss (?P<train_loss>\S+) \| )"
                           R"(gnorm (?<grad_norm>\S+))");
  REQUIRE(t.ok());
  CheckRecords(*t);
}

TEST_CASE("pattern: a template's spaces match runs of spaces and its braces escape",
          "[logs][pattern]") {
  auto t = ParseWith("it 5\t{x}  loss=2.5\nit 6 {x} loss=2.25\n", "it {step} {{x}} loss={loss}");
  REQUIRE(t.ok());
  REQUIRE(t->size() == 2);
  CHECK(t->Record(1).Get(Signal::kLoss) == 2.25);
}

TEST_CASE("pattern: what is wrong with a pattern is said before anything is read",
          "[logs][pattern]") {
  CHECK(CompileError("step {step} gnorm {gnorm}") ==
        "--pattern: unknown field \"gnorm\": the fields are step, loss, grad_norm, log_z, "
        "nan_frac, lr, z_loss_alpha, activation_max, attention_logit_p99, or a usual alias of "
        "one (train_loss, learning_rate, ...)");
  CHECK(CompileError("step {step} gnorm {grad_norm}") ==
        "--pattern \"step {step} gnorm {grad_norm}\" has no loss field: write {step}, {loss}");
  CHECK(CompileError(R"(loss (?<loss>\S+))") ==
        "--pattern \"loss (?<loss>\\S+)\" has no step group: name it (?<step>...), (?<loss>...)");
  CHECK(CompileError("step {step} loss {loss") ==
        "--pattern: the '{' at column 18 is not closed (write {{ for a brace itself)");
  CHECK(CompileError("step {step} loss {loss} }") ==
        "--pattern: the '}' at column 25 closes nothing (write }} for a brace itself)");
  CHECK(CompileError("step {step} {loss} {train_loss}") == "--pattern: loss is named twice");
  CHECK(CompileError("just text") ==
        "--pattern has no field: name the step and the loss, e.g. 'step {step} loss {loss}', or "
        "give a regex with named groups (?<step>...) and (?<loss>...)");
  CHECK(CompileError(R"((?<step>\d+ (?<loss>\S+))").rfind(
            "--pattern \"(?<step>\\d+ (?<loss>\\S+)\" is not a regex: ", 0) == 0);
}

TEST_CASE("pattern: a matched value that is not a number names line and column",
          "[logs][pattern]") {
  auto t = ParseWith("step 1 loss 2.5\nstep 2 loss 2.x4\n", R"(step (?<step>\d+) loss (?<loss>\S+))");
  REQUIRE_FALSE(t.ok());
  CHECK(t.status().message() == "train.log:2:13: loss \"2.x4\" is not a number");
  auto none = ParseWith("nothing here\n", "step {step} loss {loss}");
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().message() ==
        "train.log:1:1: no line matches --pattern \"step {step} loss {loss}\": nothing to replay");
}

TEST_CASE("pattern: a log no reader knows is an error naming the formats and --pattern",
          "[logs][pattern]") {
  ReadOptions o;
  absl::StatusOr<Trace> t = ParseMetrics(kLog, "train.log", o);
  REQUIRE_FALSE(t.ok());
  const std::string m(t.status().message());
  CHECK(m.rfind("train.log: no known format in its first lines (tried: Hugging Face Trainer, "
                "NeMo, Composer, torchtitan, JSON lines, llm.c, step:S/N, Megatron-LM, nanoGPT, "
                "DeepSpeed, a CSV whose header names a step column); a line: \"[11:44:07] "
                "step     0/400 | loss 4.5836 | gnorm 0.950 | lr 3.0e-03 | 0.0s\". Describe the "
                "lines with --pattern",
                0) == 0);
  // A CSV still gets the CSV reader's own word on its header.
  absl::StatusOr<Trace> csv = ParseMetrics("loss,grad_norm\n2,1\n", "run.csv", o);
  REQUIRE_FALSE(csv.ok());
  CHECK(csv.status().message() ==
        "run.csv:1:1: no step column in the header (step, _step, global_step or iteration)");
}

TEST_CASE("named regex: groups found by name in both spellings - the others numbered",
          "[logs][pattern]") {
  absl::StatusOr<NamedRegex> re = NamedRegex::Compile(R"(ckpt (\d+) to (?<path>\S+) [(?<x>])", "--x");
  REQUIRE(re.ok());
  CHECK(re->groups() == 2);
  CHECK(re->named().at("path") == 2);
  std::vector<absl::string_view> m;
  REQUIRE(re->Search("saved ckpt 40 to /ckpt/40 (?<x>", &m));
  CHECK(m[1] == "40");
  CHECK(m[2] == "/ckpt/40");
  CHECK_FALSE(re->Search("nothing", &m));
}

}  // namespace
}  // namespace trainwatch::logs
