// twctl replay end to end: the library command and the real binary.

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "synthetic.h"
#include "trainwatch/logs/replay.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "trainwatch/core/json.h"
#include "testing/temp_dir.h"

namespace trainwatch::logs {
namespace {

std::string TempFile(const std::string& name, const std::string& content) {
  const std::string path = trainwatch::testing::ProcessTempDir() + "/replay_" + name;
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

struct Run {
  int code;
  std::string out, err;
};

Run Replay(std::vector<std::string> args) {
  Run r;
  r.code = ReplayCommand(args, &r.out, &r.err);
  return r;
}

TEST_CASE("replay of the demo trace finds all three tiers - in JSON", "[logs][replay]") {
  const std::string path = TempFile("demo.csv", synth::ToCsv(synth::Generate(synth::DemoOptions())));
  const Run r = Replay({path, "-o", "json"});
  INFO(r.err << r.out);
  REQUIRE(r.code == 0);
  CHECK(r.err.empty());
  std::vector<core::JsonValue> events;
  size_t pos = 0;
  while (pos < r.out.size()) {
    const size_t end = r.out.find('\n', pos);
    auto v = core::ParseJson(r.out.substr(pos, end - pos), "out");
    REQUIRE(v.ok());
    for (const char* key : {"step", "tier", "action", "onset_step", "shards",
                            "recommended_checkpoint_step", "recommended_actions", "reason"}) {
      REQUIRE(v->Find(key) != nullptr);
    }
    events.push_back(*v);
    pos = end + 1;
  }
  auto find = [&](int tier, const std::string& action) -> const core::JsonValue* {
    for (const auto& e : events) {
      if (e.Find("tier")->number == tier && e.Find("action")->string == action) return &e;
    }
    return nullptr;
  };
  const core::JsonValue* t1 = find(1, "skip_update");
  REQUIRE(t1 != nullptr);
  CHECK(t1->Find("step")->number == 6000);
  REQUIRE(t1->Find("shards")->array.size() == 1);
  CHECK(t1->Find("shards")->array[0].number == 106000);
  const core::JsonValue* t2 = find(2, "page");
  REQUIRE(t2 != nullptr);
  CHECK(t2->Find("step")->number > 11000);
  CHECK(t2->Find("recommended_checkpoint_step")->number == 11000);
  bool zloss = false;
  for (const auto& a : t2->Find("recommended_actions")->array) {
    zloss |= a.Find("kind")->string == "set_z_loss_alpha";
  }
  CHECK(zloss);
  const core::JsonValue* t3 = find(3, "halt");
  REQUIRE(t3 != nullptr);
  CHECK(t3->Find("step")->number == 16000);
}

TEST_CASE("replay of a CSV whose shard column holds names reports them in the tier 1 event",
          "[logs][replay][shards]") {
  // The demo trace, its shard ids written as the names a loader would use.
  // Field 6 of each line (after the header) is the shard.
  std::string csv;
  bool header = true;
  for (absl::string_view line :
       absl::StrSplit(synth::ToCsv(synth::Generate(synth::DemoOptions())), '\n',
                      absl::SkipEmpty())) {
    std::vector<std::string> fields = absl::StrSplit(line, ',');
    if (!header) fields[5] = absl::StrCat("shard-", fields[5], ":0");
    header = false;
    csv += absl::StrJoin(fields, ",") + "\n";
  }
  const std::string path = TempFile("names.csv", csv);
  const Run json = Replay({path, "-o", "json"});
  INFO(json.err);
  REQUIRE(json.code == 0);
  const core::JsonValue* t1 = nullptr;
  std::vector<core::JsonValue> events;
  for (absl::string_view line : absl::StrSplit(json.out, '\n', absl::SkipEmpty())) {
    auto v = core::ParseJson(line, "out");
    REQUIRE(v.ok());
    events.push_back(*std::move(v));
  }
  for (const core::JsonValue& e : events) {
    if (e.Find("tier")->number == 1 && e.Find("action")->string == "skip_update") t1 = &e;
  }
  REQUIRE(t1 != nullptr);
  CHECK(t1->Find("step")->number == 6000);
  CHECK(t1->Find("shards")->array.empty());
  REQUIRE(t1->Find("shard_names") != nullptr);
  REQUIRE(t1->Find("shard_names")->array.size() == 1);
  CHECK(t1->Find("shard_names")->array[0].string == "shard-106000:0");
  // Its recommendation names the shard too, with no id range.
  bool inspects = false;
  for (const core::JsonValue& a : t1->Find("recommended_actions")->array) {
    if (a.Find("kind")->string != "inspect_shards") continue;
    inspects = true;
    CHECK(a.Find("shard_first") == nullptr);
    REQUIRE(a.Find("shard_names") != nullptr);
    CHECK(a.Find("shard_names")->array[0].string == "shard-106000:0");
    CHECK(a.Find("text")->string == "inspect shards shard-106000:0");
  }
  CHECK(inspects);
  // The table says it as well.
  const Run table = Replay({path});
  REQUIRE(table.code == 0);
  CHECK(table.out.find("shard-106000:0") != std::string::npos);
}

TEST_CASE("replay: bad input exits 2 with file - line - column and no output",
          "[logs][replay][errors]") {
  const std::string good = "step,loss,grad_norm,log_z,nan_frac\n";
  struct Case {
    std::string name, content, message;
  };
  for (const Case& c : {
           Case{"empty.csv", "", ":1:1: empty file"},
           Case{"nocol.csv", "loss,grad_norm,log_z\n2,1,8\n", ":1:1: no step column"},
           Case{"nonnum.csv", good + "1,2.5,1,8,0\n2,2.5,one,8,0\n",
                ":3:7: grad_norm \"one\" is not a number"},
           // Steps going back or repeated are a restart or more of a step, not bad
           // input (replay_attempts_test.cc).
       }) {
    const std::string path = TempFile(c.name, c.content);
    const Run r = Replay({path, "-o", "json"});
    INFO(c.name << ": " << r.err);
    CHECK(r.code == 2);
    CHECK(r.out.empty());
    CHECK(r.err.find(path + c.message) != std::string::npos);
  }
}

TEST_CASE("replay: usage errors and configuration", "[logs][replay]") {
  CHECK(Replay({}).code == 2);
  CHECK(Replay({"a.csv", "-o", "yaml"}).code == 2);
  CHECK(Replay({"a.csv", "--bogus"}).code == 2);
  CHECK(Replay({"/nonexistent.csv"}).code == 1);
  const Run help = Replay({"--help"});
  CHECK(help.code == 0);
  CHECK(help.out.find("usage: twctl replay") != std::string::npos);

  const Run printed = Replay({"--print-config"});
  REQUIRE(printed.code == 0);
  CHECK(printed.out.find("\"tier1_grad_ratio\": 3") != std::string::npos);

  // A stricter configuration changes the answer: with the grad threshold at
  // 10x the demo's 6.3x outlier is no longer a data anomaly.
  const std::string trace =
      TempFile("cfg_demo.csv", synth::ToCsv(synth::Generate(synth::DemoOptions())));
  const std::string cfg = TempFile("cfg.json", "{\"tier1_grad_ratio\": 10}");
  const Run strict = Replay({trace, "--config", cfg, "-o", "json"});
  REQUIRE(strict.code == 0);
  CHECK(strict.out.find("data_anomaly") == std::string::npos);
  CHECK(strict.out.find("loss_ratio_skip") != std::string::npos);
  const std::string bad_cfg = TempFile("bad_cfg.json", "{\"tier1_grad_ratio\": \"x\"}");
  const Run bad = Replay({trace, "--config", bad_cfg});
  CHECK(bad.code == 2);
  CHECK(bad.err.find("bad_cfg.json:1:22: tier1_grad_ratio must be a finite number") !=
        std::string::npos);
}

TEST_CASE("replay: --print-config shows the bounds and reads back - a value past one is refused",
          "[logs][replay][bounds]") {
  const Run printed = Replay({"--print-config"});
  REQUIRE(printed.code == 0);
  CHECK(printed.out.find("\"bounds\": {") != std::string::npos);
  CHECK(printed.out.find("\"max_shards_per_step\": 65536") != std::string::npos);
  CHECK(printed.out.find("\"memory_budget_bytes_per_run\": 67108864") != std::string::npos);
  const std::string trace =
      TempFile("bounds_demo.csv", synth::ToCsv(synth::Generate(synth::DemoOptions())));
  const std::string back = TempFile("printed.json", printed.out);
  CHECK(Replay({trace, "--config", back, "--summary"}).code == 0);
  // Valid before bounds, this aborted the replay with bad_alloc.
  const std::string huge = TempFile("huge.json", "{\"max_shards_per_step\":1000000000000}");
  const Run refused = Replay({trace, "--config", huge});
  CHECK(refused.code == 2);
  CHECK(refused.err.find(huge + ": max_shards_per_step = 1000000000000 is above its bound 65536") !=
        std::string::npos);
}

TEST_CASE("replay: --format csv is strict and --map reaches the reader", "[logs][replay]") {
  const std::string partial = TempFile("partial.csv", "step,loss,log_z\n1,2.5,8\n2,2.5,8\n");
  const Run lenient = Replay({partial, "-o", "json"});
  CHECK(lenient.code == 0);  // an export: grad_norm and nan_frac unknown
  const Run strict = Replay({partial, "--format", "csv"});
  CHECK(strict.code == 2);
  CHECK(strict.out.empty());
  CHECK(strict.err.find(partial + ":1:1: header lacks the columns grad_norm, nan_frac") !=
        std::string::npos);
  CHECK(Replay({partial, "--format", "yaml"}).code == 2);

  const std::string wandb = TempFile("wandb.csv", "Step,my_loss\n1,2.5\n2,2.4\n");
  const Run unmapped = Replay({wandb});
  CHECK(unmapped.code == 2);
  CHECK(unmapped.err.find("--map loss=") != std::string::npos);
  const Run mapped = Replay({wandb, "--map", "loss=my_loss", "--summary"});
  INFO(mapped.err);
  CHECK(mapped.code == 0);
  CHECK(mapped.out.find("records 2") != std::string::npos);
  CHECK(Replay({wandb, "--map", "bogus=my_loss"}).code == 2);
}

TEST_CASE("replay --summary counts incidents per tier and skipped steps", "[logs][replay]") {
  const std::string trace =
      TempFile("sum_demo.csv", synth::ToCsv(synth::Generate(synth::DemoOptions())));
  const Run r = Replay({trace, "--summary", "-o", "json"});
  REQUIRE(r.code == 0);
  INFO(r.out);
  CHECK(r.out.find("{\"tier\":1,\"incidents\":1,\"events\":1,\"first_step\":6000,"
                   "\"last_step\":6000,\"skipped_steps\":1}") != std::string::npos);
  CHECK(r.out.find("{\"tier\":3,\"incidents\":1,\"events\":1,\"first_step\":16000") !=
        std::string::npos);
}

TEST_CASE("replay: a pipe named by its path (a FIFO or /dev/stdin) is read like a file",
          "[logs][replay]") {
  // A pipe has no size: the reader must not size its buffer by one.
  std::signal(SIGPIPE, SIG_IGN);  // a writer left without a reader fails, not dies
  const std::string fifo = std::string(P_tmpdir) + "/tw_replay_test_fifo_" +
                           std::to_string(getpid());
  ::unlink(fifo.c_str());
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const std::string csv = synth::ToCsv(synth::Generate(synth::DemoOptions()));
  std::thread writer([&] {
    std::ofstream(fifo, std::ios::binary) << csv;  // opens when the reader does
  });
  const Run r = Replay({fifo, "--summary", "-o", "json"});
  // Should the reader have failed before opening, release the writer: its
  // open returns, and its write fails on the closed pipe.
  const int fd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  if (fd >= 0) ::close(fd);
  writer.join();
  ::unlink(fifo.c_str());
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("{\"tier\":1,\"incidents\":1,") != std::string::npos);
}

TEST_CASE("the twctl binary: table output and exit codes", "[logs][binary]") {
  const std::string trace =
      TempFile("bin_demo.csv", synth::ToCsv(synth::Generate(synth::DemoOptions())));
  FILE* p = popen((std::string(TWCTL_PATH) + " replay " + trace + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = pclose(p);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(out.rfind("STEP", 0) == 0);
  CHECK(out.find("skip_update") != std::string::npos);
  CHECK(out.find("page") != std::string::npos);
  CHECK(out.find("halt") != std::string::npos);

  const int bad = std::system((std::string(TWCTL_PATH) + " frobnicate >/dev/null 2>&1").c_str());
  REQUIRE(WIFEXITED(bad));
  CHECK(WEXITSTATUS(bad) == 2);
}

}  // namespace
}  // namespace trainwatch::logs
