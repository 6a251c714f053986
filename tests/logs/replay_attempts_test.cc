// A job restarted from a checkpoint that kept logging into the same file:
// the steps go back, and twctl replay opens a new attempt there, as
// trainwatchd does after a resume. The log reaches step 99, goes back to 51
// (resumed after the checkpoint of step 50) and runs to 149.

#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "trainwatch/logs/replay.h"
#include "trainwatch/core/json.h"
#include "testing/temp_dir.h"

namespace trainwatch::logs {
namespace {

struct Line {
  int64_t step;
  double loss, grad_norm, nan_frac;
  std::string checkpoint;
};

// Healthy steps with a little deterministic noise; `spike` a bad batch (tier
// 1), `nan` a numerical failure (tier 3).
Line Step(int64_t step, bool spike = false, bool nan = false) {
  Line l{step, 2.5 + 0.02 * std::sin(0.7 * static_cast<double>(step)),
         1.0 + 0.05 * std::cos(1.3 * static_cast<double>(step)), 0.0, ""};
  if (spike) {
    l.loss = 6.0;
    l.grad_norm = 12.0;
  }
  if (nan) l.nan_frac = 0.01;
  return l;
}

// Attempt 0: 0..99 with a bad batch at 80 and checkpoints at 0, 50 and 90;
// attempt 1: 51..149 with a bad batch at 120, a NaN at 140 and no checkpoint.
std::vector<Line> RestartedLog() {
  std::vector<Line> log;
  for (int64_t s = 0; s <= 99; ++s) {
    log.push_back(Step(s, s == 80));
    if (s == 0 || s == 50 || s == 90) log.back().checkpoint = absl::StrCat("ckpt://", s);
  }
  for (int64_t s = 51; s <= 149; ++s) log.push_back(Step(s, s == 120, s == 140));
  return log;
}

// What attempt 1 saw as its life: attempt 0 up to the resume point, then its own.
std::vector<Line> StraightLog() {
  std::vector<Line> log;
  for (const Line& l : RestartedLog()) {
    if (log.empty() || l.step > log.back().step) {
      log.push_back(l);
    } else {
      while (log.back().step >= l.step) log.pop_back();
      log.push_back(l);
    }
  }
  return log;
}

std::string Csv(const std::vector<Line>& log) {
  std::string out = "step,loss,grad_norm,log_z,nan_frac,checkpoint\n";
  for (const Line& l : log) {
    absl::StrAppend(&out, l.step, ",", l.loss, ",", l.grad_norm, ",8,", l.nan_frac, ",",
                    l.checkpoint, "\n");
  }
  return out;
}

std::string Jsonl(const std::vector<Line>& log) {
  std::string out;
  for (const Line& l : log) {
    absl::StrAppend(&out, "{\"step\": ", l.step, ", \"loss\": ", l.loss,
                    ", \"grad_norm\": ", l.grad_norm, ", \"log_z\": 8, \"nan_frac\": ", l.nan_frac);
    if (!l.checkpoint.empty()) absl::StrAppend(&out, ", \"checkpoint\": \"", l.checkpoint, "\"");
    out += "}\n";
  }
  return out;
}

std::string TempFile(const std::string& name, const std::string& content) {
  const std::string path = trainwatch::testing::ProcessTempDir() + "/attempts_" + name;
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

// One line of output, as printed and parsed.
struct JsonLine {
  std::string raw;
  core::JsonValue v;
  const core::JsonValue* Find(const char* key) const { return v.Find(key); }
};

// `twctl replay` with a short warm-up, its output as JSON lines.
std::vector<JsonLine> ReplayJson(const std::string& path, std::vector<std::string> extra) {
  const std::string config = TempFile("config.json", "{\"warmup_steps\": 20}");
  std::vector<std::string> args = {path, "--config", config, "-o", "json"};
  args.insert(args.end(), extra.begin(), extra.end());
  std::string out, err;
  const int code = ReplayCommand(args, &out, &err);
  INFO(err);
  REQUIRE(code == 0);
  std::vector<JsonLine> lines;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    auto v = core::ParseJson(line, "out");
    REQUIRE(v.ok());
    lines.push_back({std::string(line), *std::move(v)});
  }
  return lines;
}

std::vector<const JsonLine*> With(const std::vector<JsonLine>& lines, const char* key) {
  std::vector<const JsonLine*> found;
  for (const JsonLine& v : lines) {
    if (v.Find(key) != nullptr) found.push_back(&v);
  }
  return found;
}

TEST_CASE("replay: steps going back open a new attempt - every record counted",
          "[logs][replay][attempts]") {
  for (const auto& [name, content] :
       {std::pair<std::string, std::string>{"restart.csv", Csv(RestartedLog())},
        {"restart.jsonl", Jsonl(RestartedLog())}}) {
    INFO(name);
    const std::vector<JsonLine> summary = ReplayJson(TempFile(name, content), {"--summary"});
    const std::vector<const JsonLine*> attempts = With(summary, "attempt");
    REQUIRE(attempts.size() == 2);
    const JsonLine& first = *attempts[0];
    CHECK(first.Find("resumed_from")->type == core::JsonValue::Type::kNull);
    CHECK(first.Find("first_step")->number == 0);
    CHECK(first.Find("last_step")->number == 99);
    CHECK(first.Find("records")->number == 100);
    CHECK(first.Find("skipped_steps")->number == 1);  // the bad batch of step 80
    const JsonLine& second = *attempts[1];
    CHECK(second.Find("resumed_from")->number == 50);
    CHECK(second.Find("first_step")->number == 51);
    CHECK(second.Find("last_step")->number == 149);
    CHECK(second.Find("records")->number == 99);
    CHECK(second.Find("halted_at")->number == 140);
    CHECK(first.Find("records")->number + second.Find("records")->number == 199);
    // The bad batches of steps 80 and 120 are two incidents, though the
    // rebuilt engine numbers the second episode 1 again.
    for (const JsonLine* tier : With(summary, "tier")) {
      if (tier->Find("tier")->number == 1) CHECK(tier->Find("incidents")->number == 2);
    }
  }
  // The table says it too.
  std::string out, err;
  REQUIRE(ReplayCommand({TempFile("restart_t.csv", Csv(RestartedLog())), "--summary"}, &out,
                        &err) == 0);
  CHECK(out.find("records 199,") != std::string::npos);
  CHECK(out.find("1        50       51..149") != std::string::npos);
}

TEST_CASE("replay: the abandoned tail stays its attempt's and never reaches the next one",
          "[logs][replay][attempts]") {
  const std::vector<JsonLine> events = ReplayJson(TempFile("tail.csv", Csv(RestartedLog())), {});
  std::vector<std::string> first, second;
  for (const JsonLine& e : events) {
    const int64_t step = static_cast<int64_t>(e.Find("step")->number);
    (e.Find("attempt")->number == 0 ? first : second).push_back(e.raw);
    if (e.Find("attempt")->number == 1) CHECK(step > 50);
  }
  // The tail's bad batch is attempt 0's event.
  bool tail_spike = false;
  for (const JsonLine& e : events) {
    if (e.Find("step")->number == 80) {
      tail_spike = e.Find("attempt")->number == 0 && e.Find("action")->string == "skip_update";
    }
  }
  CHECK(tail_spike);
  // Attempt 1 judged exactly as a log that never had the tail: the same
  // events, to the numbers in their reasons; and its halt recommends the
  // checkpoint of step 50, not the abandoned tail's of step 90.
  const std::vector<JsonLine> straight =
      ReplayJson(TempFile("straight.csv", Csv(StraightLog())), {});
  std::vector<std::string> expected;
  for (const JsonLine& e : straight) {
    if (e.Find("step")->number > 50) expected.push_back(e.raw);
  }
  REQUIRE_FALSE(expected.empty());
  for (std::string& e : second) {  // the attempt key is the only difference
    const size_t at = e.find("\"attempt\":1");
    REQUIRE(at != std::string::npos);
    e.replace(at, 11, "\"attempt\":0");
  }
  CHECK(second == expected);
  bool halt_seen = false;
  for (const JsonLine& e : events) {
    if (e.Find("action")->string != "halt") continue;
    halt_seen = true;
    CHECK(e.Find("attempt")->number == 1);
    CHECK(e.Find("recommended_checkpoint_step")->number == 50);
  }
  CHECK(halt_seen);
}

TEST_CASE("replay: a step repeated with the same values is one record - with others a restart",
          "[logs][replay][attempts]") {
  std::string out, err;
  // Every rank printed the line: one record, one attempt.
  const std::string dup = TempFile(
      "dup_attempts.csv", "step,loss,grad_norm,log_z,nan_frac\n0,2.6,1,8,0\n1,2.5,1,8,0\n"
                          "1,2.5,1,8,0\n2,2.4,1,8,0\n");
  const std::vector<JsonLine> same = ReplayJson(dup, {"--summary"});
  const std::vector<const JsonLine*> one = With(same, "attempt");
  REQUIRE(one.size() == 1);
  CHECK(one[0]->Find("records")->number == 3);
  // Another loss at step 1: the job ran step 1 again (a restart there), kept
  // as its own attempt resuming after step 0, not merged over the first.
  const std::string again = TempFile(
      "again_attempts.csv", "step,loss,grad_norm,log_z,nan_frac\n0,2.6,1,8,0\n1,2.5,1,8,0\n"
                            "1,2.45,1,8,0\n2,2.4,1,8,0\n");
  const std::vector<const JsonLine*> two = With(ReplayJson(again, {"--summary"}), "attempt");
  REQUIRE(two.size() == 2);
  CHECK(two[0]->Find("records")->number == 2);
  CHECK(two[1]->Find("resumed_from")->number == 0);
  CHECK(two[1]->Find("first_step")->number == 1);
  CHECK(two[1]->Find("records")->number == 2);
}

}  // namespace
}  // namespace trainwatch::logs
