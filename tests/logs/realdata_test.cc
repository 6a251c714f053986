// Replays of real public training logs (tests/data/realdata, metric lines
// only), asserting what their README says happens in each.

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "testing/event_file_writer.h"
#include "synthetic.h"
#include "trainwatch/logs/metrics_file.h"
#include "trainwatch/logs/replay.h"
#include "trainwatch/logs/tensorboard.h"
#include "testing/temp_dir.h"

namespace trainwatch::logs {
namespace {

const std::string kDir = TRAINWATCH_REALDATA_DIR;

struct Replayed {
  Trace trace;
  ReplayResult result;
};

Replayed Load(const std::string& name, MetricsFormat expect) {
  auto trace = ReadMetricsFile(kDir + "/" + name);
  INFO(kDir << "/" << name);
  REQUIRE(trace.ok());
  CHECK(trace->format() == expect);
  auto result = Replay(*trace, core::RuleConfig());
  REQUIRE(result.ok());
  return {*std::move(trace), *std::move(result)};
}

std::string Dump(const ReplayResult& r) { return FormatEventsTable(r); }

size_t CountTierAtLeast(const ReplayResult& r, int tier) {
  size_t n = 0;
  for (const auto& e : r.events) n += e.tier >= tier;
  return n;
}

TEST_CASE("real log: llm.c GPT-2 124M is clean - its 15x grad outlier is not a page",
          "[logs][realdata]") {
  const Replayed r = Load("llmc-gpt2-124m.main.log", MetricsFormat::kLlmc);
  INFO(Dump(r.result));
  CHECK(r.trace.size() == 19552);
  CHECK(r.trace.reported() == (core::Bit(core::Signal::kLoss) |
                               core::Bit(core::Signal::kGradNorm) |
                               core::Bit(core::Signal::kLearningRate)));
  CHECK(CountTierAtLeast(r.result, 2) == 0);
  for (const auto& e : r.result.events) CHECK(e.action != core::Action::kPage);
}

TEST_CASE("real log: modded-nanogpt 1.5B is clean - its bump at 2730 is not a page",
          "[logs][realdata]") {
  const Replayed r = Load("modded-nanogpt-1p5b.log", MetricsFormat::kStepLog);
  INFO(Dump(r.result));
  CHECK(r.trace.size() == 20344);
  CHECK(CountTierAtLeast(r.result, 2) == 0);
  for (const auto& e : r.result.events) {
    CHECK(e.lacked_signals == (core::Bit(core::Signal::kGradNorm) |
                               core::Bit(core::Signal::kLogZ) |
                               core::Bit(core::Signal::kNanFrac)));
  }
}

TEST_CASE("real log: BitNet's spike at 1132-1142 is reported as a transient and not paged",
          "[logs][realdata]") {
  const Replayed r = Load("parameter-golf-bitnet.train.log", MetricsFormat::kStepLog);
  INFO(Dump(r.result));
  CHECK(r.trace.size() == 10000);
  CHECK(CountTierAtLeast(r.result, 2) == 0);
  const core::Event* spike = nullptr;
  for (const auto& e : r.result.events) {
    if (e.onset_step >= 1132 && e.onset_step <= 1142) spike = &e;
  }
  REQUIRE(spike != nullptr);
  CHECK(spike->tier <= 1);
  CHECK((spike->kind == core::EventKind::kTransient || spike->kind == core::EventKind::kSpike ||
         spike->kind == core::EventKind::kDataAnomaly));
  CHECK(spike->step <= 1150);
  CHECK(spike->action != core::Action::kPage);
  // The sequence-length changes at 335, 1002 and 1668 are not incidents.
  for (const auto& e : r.result.events) {
    for (int64_t confounder : {335, 1002, 1668}) {
      CHECK_FALSE((e.onset_step >= confounder && e.onset_step <= confounder + 10));
    }
  }
}

TEST_CASE("real log: Behemoth's NaN loss at step 1200 is tier 3 at that step",
          "[logs][realdata]") {
  const Replayed r = Load("parameter-golf-behemoth-v10.log", MetricsFormat::kStepLog);
  INFO(Dump(r.result));
  std::vector<core::Event> t3;
  for (const auto& e : r.result.events) {
    if (e.tier == 3) t3.push_back(e);
  }
  REQUIRE(t3.size() == 1);  // one episode, however many NaN steps follow
  CHECK(t3[0].step == 1200);
  CHECK(t3[0].action == core::Action::kHalt);
  CHECK(t3[0].reason.find("loss is nan") != std::string::npos);
  CHECK(r.result.halted_at == 1200);
  CHECK(CountTierAtLeast(r.result, 2) == 1);
}

TEST_CASE("real logs: with their vocabulary known the no-baseline tier 3 never fires on a healthy "
          "step",
          "[logs][realdata][vocab]") {
  // The vocabularies: GPT-2's tokenizer (llm.c, 50257), modded-nanogpt's
  // padded one (50304), parameter-golf's 1,024-token SentencePiece model
  // (both start at ln(1024) = 6.93), nanoGPT's Shakespeare characters (65).
  struct Log {
    std::string path;
    int64_t vocab;
  };
  for (const Log& log : {Log{kDir + "/llmc-gpt2-124m.main.log", 50257},
                         Log{kDir + "/modded-nanogpt-1p5b.log", 50304},
                         Log{kDir + "/parameter-golf-bitnet.train.log", 1024},
                         Log{kDir + "/parameter-golf-behemoth-v10.log", 1024},
                         Log{std::string(TRAINWATCH_FORMATS_DIR) + "/nanogpt-shakespeare.log", 65}}) {
    INFO(log.path);
    auto trace = ReadMetricsFile(log.path);
    REQUIRE(trace.ok());
    core::RuleConfig c;
    c.vocab_size = log.vocab;
    auto result = Replay(*trace, c);
    REQUIRE(result.ok());
    INFO(Dump(*result));
    for (const core::Event& e : result->events) {
      CHECK(e.reason.find("ln(vocab_size") == std::string::npos);
    }
    // The margin: the highest finite loss of each (the first steps of a
    // fresh model: modded-nanogpt's step 1 is 2.1x) stays well under the
    // factor.
    double highest = 0;
    for (size_t i = 0; i < trace->size(); ++i) {
      const double loss = trace->Record(i).Get(core::Signal::kLoss);
      if (std::isfinite(loss)) highest = std::max(highest, loss);
    }
    CHECK(highest / std::log(static_cast<double>(log.vocab)) < c.tier3_vocab_factor / 1.25);
  }
}

// Writes `trace` as a TensorBoard log folder, the way a trainer calling
// add_scalar once per metric and step would: loss as simple_value (float, as
// torch writes it), grad_norm as a double tensor, the rest as float tensors
// in tensor_content; the run split into two files at its middle step, the
// second written after the first (a restart).
std::string ToEventFolder(const Trace& trace, const std::string& name) {
  using testing::ScalarKind;
  const std::string dir = trainwatch::testing::ProcessTempDir() + "/tfevents_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::string files[2];
  const double t0 = 1.7e9;
  files[0] = testing::FileVersionRecord(t0);
  files[1] = testing::FileVersionRecord(t0 + 1e6);
  for (size_t i = 0; i < trace.size(); ++i) {
    const core::StepRecord r = trace.Record(i);
    const int f = i < trace.size() / 2 ? 0 : 1;
    const double wall = t0 + static_cast<double>(i);
    for (int s = 0; s < core::kNumSignals; ++s) {
      const auto sig = static_cast<core::Signal>(s);
      if (!r.Has(sig)) continue;
      std::string tag(core::SignalName(sig));
      ScalarKind kind = ScalarKind::kFloatContent;
      if (sig == core::Signal::kLoss) {
        tag = "train/loss";
        kind = ScalarKind::kSimpleValue;
      } else if (sig == core::Signal::kGradNorm) {
        kind = ScalarKind::kDoubleVal;
      } else if (sig == core::Signal::kLearningRate) {
        tag = "learning_rate";
      }
      files[f] += testing::ScalarRecord(r.step, wall, tag, r.Get(sig), kind);
    }
  }
  testing::WriteFile(dir + "/events.out.tfevents.1700000000.host.1.0", files[0]);
  testing::WriteFile(dir + "/events.out.tfevents.1701000000.host.2.0", files[1]);
  return dir;
}

TEST_CASE("realdata as tensorboard event files: the text logs' verdicts",
          "[logs][realdata][tensorboard]") {
  for (const auto& [name, format] :
       std::vector<std::pair<std::string, MetricsFormat>>{
           {"llmc-gpt2-124m.main.log", MetricsFormat::kLlmc},
           {"modded-nanogpt-1p5b.log", MetricsFormat::kStepLog},
           {"parameter-golf-bitnet.train.log", MetricsFormat::kStepLog},
           {"parameter-golf-behemoth-v10.log", MetricsFormat::kStepLog}}) {
    INFO(name);
    const Replayed text = Load(name, format);
    auto events = ReadEventFiles(ToEventFolder(text.trace, name));
    REQUIRE(events.ok());
    CHECK(events->format() == MetricsFormat::kTensorBoard);
    CHECK(events->size() == text.trace.size());
    CHECK(events->reported() == text.trace.reported());
    CHECK(events->warnings().empty());
    auto result = Replay(*events, core::RuleConfig());
    REQUIRE(result.ok());
    INFO("text:\n" << Dump(text.result) << "event files:\n" << Dump(*result));
    CHECK(result->halted_at == text.result.halted_at);
    CHECK(result->skipped_steps == text.result.skipped_steps);
    REQUIRE(result->events.size() == text.result.events.size());
    for (size_t i = 0; i < result->events.size(); ++i) {
      const core::Event& a = result->events[i];
      const core::Event& b = text.result.events[i];
      CHECK(a.step == b.step);
      CHECK(a.tier == b.tier);
      CHECK(a.kind == b.kind);
      CHECK(a.action == b.action);
      CHECK(a.onset_step == b.onset_step);
    }
  }
}

TEST_CASE("replay speed: a 500k-step metrics file in well under a few seconds",
          "[logs][speed]") {
  synth::Options o;
  o.steps = 500000;
  const std::string csv = synth::ToCsv(synth::Generate(o));
  const auto t0 = std::chrono::steady_clock::now();
  auto trace = ParseMetrics(csv, "500k.csv");
  REQUIRE(trace.ok());
  auto result = Replay(*trace, core::RuleConfig());
  REQUIRE(result.ok());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  WARN("500k-step CSV parsed and replayed in " << seconds << " s");
  CHECK(result->records == 500000);
  // Well under a few seconds even on a loaded 2-core machine.
  CHECK(seconds < 3.0);
}

}  // namespace
}  // namespace trainwatch::logs
