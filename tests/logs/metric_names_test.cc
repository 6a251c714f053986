// One table of metric names for every keyed format (SignalByAlias): each
// name is read by JSON lines, CSV exports and Hugging Face dicts alike, and
// docs/log-formats.md lists exactly the table.

#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "trainwatch/core/step_record.h"
#include "trainwatch/logs/metrics_file.h"
#include "trainwatch/logs/trace_builder.h"

namespace trainwatch::logs {
namespace {

using core::Signal;

// The loss line a file needs beside another signal's name.
std::string LossKey(Signal s) { return s == Signal::kLoss ? "" : "\"loss\": 2.5, "; }

TEST_CASE("metric names: every name of the table is read by every keyed format",
          "[logs][names]") {
  for (int i = 0; i < core::kNumSignals; ++i) {
    const Signal s = static_cast<Signal>(i);
    const std::vector<std::string> names = AliasesOf(s);
    REQUIRE_FALSE(names.empty());
    CHECK(names.front() == core::SignalName(s));  // its own name first
    for (const std::string& name : names) {
      INFO(core::SignalName(s) << " as \"" << name << "\"");
      // JSON lines.
      auto j = ParseMetrics("{\"step\": 1, " + LossKey(s) + "\"" + name + "\": 0.25}\n", "j");
      REQUIRE(j.ok());
      CHECK(j->Record(0).Get(s) == 0.25);
      // A CSV export, in the case a logger may print it.
      const std::string upper = absl::AsciiStrToUpper(name);
      auto c = ParseMetrics(std::string("step,") + (s == Signal::kLoss ? "" : "loss,") + upper +
                                "\n1," + (s == Signal::kLoss ? "" : "2.5,") + "0.25\n",
                            "c");
      REQUIRE(c.ok());
      CHECK(c->Record(0).Get(s) == 0.25);
      // A Hugging Face dict: its loss is 'loss'; its other keys by the table.
      if (s != Signal::kLoss) {
        ReadOptions o;
        o.format = MetricsFormat::kHfTrainer;
        o.logging_steps = 1;
        auto h = ParseMetrics("{'loss': 2.5, '" + name + "': 0.25}\n", "h", o);
        REQUIRE(h.ok());
        CHECK(h->Record(0).Get(s) == 0.25);
      }
    }
  }
}

TEST_CASE("metric names: a file without a loss names what it has", "[logs][names]") {
  auto c = ParseMetrics("step,train/lss,grad_norm\n1,2,1\n", "run.csv");
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().message() ==
        "run.csv:1:1: no loss column in the header (its columns: step, train/lss, grad_norm); "
        "name it with --map, e.g. --map loss=train/loss (the names read without it: "
        "docs/log-formats.md)");
  // An epoch's average is not the loss; the summary's train_loss is not a record.
  CHECK_FALSE(ParseMetrics("step,train_loss_epoch\n1,2\n", "e.csv").ok());
  ReadOptions o;
  o.logging_steps = 1;
  auto h = ParseMetrics("{'loss': 2.5}\n{'train_runtime': 3.0, 'train_loss': 2.4}\n", "h", o);
  REQUIRE(h.ok());
  CHECK(h->size() == 1);
}

TEST_CASE("metric names: docs/log-formats.md lists the table", "[logs][names][docs]") {
  std::ifstream in(std::string(TRAINWATCH_DOCS_DIR) + "/log-formats.md");
  REQUIRE(in);
  std::stringstream text;
  text << in.rdbuf();
  // "| `loss` | `loss`, `train/loss`, ... |"
  std::map<std::string, std::set<std::string>> documented;
  for (absl::string_view line : absl::StrSplit(text.str(), '\n')) {
    std::vector<absl::string_view> cells = absl::StrSplit(line, '|');
    if (cells.size() != 4 || !absl::StartsWith(absl::StripAsciiWhitespace(cells[1]), "`")) {
      continue;
    }
    const std::string signal(absl::StripPrefix(
        absl::StripSuffix(absl::StripAsciiWhitespace(cells[1]), "`"), "`"));
    Signal s;
    if (!SignalByName(signal, &s) || !absl::StrContains(cells[2], "`, `")) continue;
    for (absl::string_view n : absl::StrSplit(cells[2], ',')) {
      n = absl::StripAsciiWhitespace(n);
      documented[signal].insert(std::string(absl::StripPrefix(absl::StripSuffix(n, "`"), "`")));
    }
  }
  for (int i = 0; i < core::kNumSignals; ++i) {
    const Signal s = static_cast<Signal>(i);
    const std::vector<std::string> names = AliasesOf(s);
    if (names.size() < 2) continue;  // a signal with one name needs no row
    INFO(core::SignalName(s));
    CHECK(documented[std::string(core::SignalName(s))] ==
          std::set<std::string>(names.begin(), names.end()));
  }
}

}  // namespace
}  // namespace trainwatch::logs
