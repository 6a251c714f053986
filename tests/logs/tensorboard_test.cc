// TensorBoard event files: CRC32C, TFRecord framing read incrementally, the
// two scalar kinds, tag mapping, folder merges, damaged files, and a folder
// written by an independent writer (write_tfevents.py) through twctl.

#include "trainwatch/logs/tensorboard.h"

#include <sys/stat.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "testing/event_file_writer.h"
#include "trainwatch/core/event.h"
#include "trainwatch/logs/replay.h"
#include "testing/temp_dir.h"

namespace trainwatch::logs {
namespace {

using testing::ScalarKind;
using testing::ScalarRecord;

// A fresh, empty folder under the temporary directory.
std::string TempDir(const std::string& name) {
  const std::string dir = trainwatch::testing::ProcessTempDir() + "/tensorboard_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

double Value(const Trace& t, size_t row, core::Signal s) {
  const core::StepRecord r = t.Record(row);
  REQUIRE(r.Has(s));
  return r.Get(s);
}

TEST_CASE("tensorboard: crc32c matches the published test vectors", "[logs][tensorboard]") {
  CHECK(Crc32c("") == 0u);
  CHECK(Crc32c("123456789") == 0xE3069283u);
  CHECK(Crc32c("a") == 0xC1D04330u);
  // RFC 3720 (iSCSI) appendix B.4.
  CHECK(Crc32c(std::string(32, '\0')) == 0x8A9136AAu);
  CHECK(Crc32c(std::string(32, '\xff')) == 0x62A8AB43u);
  std::string up, down;
  for (int i = 0; i < 32; ++i) {
    up.push_back(static_cast<char>(i));
    down.push_back(static_cast<char>(31 - i));
  }
  CHECK(Crc32c(up) == 0x46DD794Eu);
  CHECK(Crc32c(down) == 0x113FDB5Cu);
  CHECK(ExtendCrc32c(Crc32c("1234"), "56789") == 0xE3069283u);
}

TEST_CASE("tensorboard: masked crc is TFRecord's rotation plus constant and unmasks",
          "[logs][tensorboard]") {
  CHECK(MaskCrc32c(0) == 0xa282ead8u);
  const uint32_t c = 0xE3069283u;
  CHECK(MaskCrc32c(c) == static_cast<uint32_t>(((c >> 15) | (c << 17)) + 0xa282ead8u));
  for (uint32_t x : {0u, 1u, 0xE3069283u, 0xffffffffu, 0x80000000u}) {
    CHECK(UnmaskCrc32c(MaskCrc32c(x)) == x);
  }
}

TEST_CASE("tensorboard: framing round trip - fed all at once and one byte at a time",
          "[logs][tensorboard]") {
  const std::vector<std::string> datas = {"", "x", std::string(300, 'q'), "brain.Event:2"};
  std::string stream;
  for (const std::string& d : datas) stream += FrameRecord(d);
  CHECK(FrameRecord("x").size() == 12 + 1 + 4);
  CHECK(LooksLikeEventFile(stream));
  CHECK_FALSE(LooksLikeEventFile("step,loss,grad_norm\n1,2,3\n"));

  SECTION("all at once") {
    RecordReader r("s");
    r.Append(stream);
    absl::string_view rec;
    for (const std::string& d : datas) {
      auto st = r.Next(&rec);
      REQUIRE(st.ok());
      REQUIRE(*st == ReadState::kRecord);
      CHECK(rec == d);
    }
    auto st = r.Next(&rec);
    REQUIRE(st.ok());
    CHECK(*st == ReadState::kNeedMore);
    CHECK(r.pending() == 0);
    CHECK(r.offset() == stream.size());
  }
  SECTION("one byte at a time: need more until each record is whole") {
    RecordReader r("s");
    std::vector<std::string> got;
    absl::string_view rec;
    for (char c : stream) {
      r.Append(absl::string_view(&c, 1));
      for (;;) {
        auto st = r.Next(&rec);
        REQUIRE(st.ok());
        if (*st == ReadState::kNeedMore) break;
        got.emplace_back(rec);
      }
    }
    CHECK(got == datas);
    CHECK(r.pending() == 0);
  }
}

TEST_CASE("tensorboard: a bad data CRC is an error naming the file and byte offset",
          "[logs][tensorboard]") {
  std::string stream = FrameRecord("first") + FrameRecord("second");
  const size_t second = FrameRecord("first").size();
  stream[second + 12 + 2] ^= 0x20;  // a byte of "second"
  RecordReader r("run/events.out.tfevents.1");
  r.Append(stream);
  absl::string_view rec;
  REQUIRE(*r.Next(&rec) == ReadState::kRecord);
  auto st = r.Next(&rec);
  REQUIRE_FALSE(st.ok());
  const std::string msg(st.status().message());
  INFO(msg);
  CHECK(absl::IsDataLoss(st.status()));
  CHECK(msg.find("run/events.out.tfevents.1") != std::string::npos);
  CHECK(msg.find("byte offset " + std::to_string(second)) != std::string::npos);
  CHECK(msg.find("CRC") != std::string::npos);
  // The error sticks: more bytes do not resynchronise silently.
  r.Append(FrameRecord("third"));
  CHECK_FALSE(r.Next(&rec).ok());
}

TEST_CASE("tensorboard: a bad length CRC is corruption - not a record waiting for bytes",
          "[logs][tensorboard]") {
  std::string stream = FrameRecord("abc");
  stream[0] ^= 0x01;  // the length, so its CRC no longer checks
  RecordReader r("f");
  r.Append(stream.substr(0, 12));  // just the header: already known bad
  absl::string_view rec;
  auto st = r.Next(&rec);
  REQUIRE_FALSE(st.ok());
  CHECK(std::string(st.status().message()).find("f: byte offset 0") != std::string::npos);
}

TEST_CASE("tensorboard: replay of a corrupt event file fails with file and offset",
          "[logs][tensorboard]") {
  const std::string dir = TempDir("corrupt");
  std::string bytes = testing::FileVersionRecord(1.0) + ScalarRecord(1, 2.0, "loss", 1.5);
  const size_t bad = bytes.size();
  bytes += ScalarRecord(2, 3.0, "loss", 1.4);
  bytes[bytes.size() - 1] ^= 0x55;  // the last record's data CRC
  const std::string path = dir + "/events.out.tfevents.1.host";
  testing::WriteFile(path, bytes);
  std::string out, err;
  CHECK(ReplayCommand({dir}, &out, &err) == 2);
  INFO(err);
  CHECK(out.empty());
  CHECK(err.find(path + ": byte offset " + std::to_string(bad)) != std::string::npos);
}

TEST_CASE(
    "tensorboard: a torn final record reads as need more - and replay warns naming file and offset",
    "[logs][tensorboard]") {
  const std::string good = testing::FileVersionRecord(1.0) + ScalarRecord(1, 2.0, "loss", 2.0) +
                           ScalarRecord(2, 3.0, "loss", 1.9);
  const std::string last = ScalarRecord(3, 4.0, "loss", 1.8);
  for (size_t cut : {size_t{5}, size_t{12}, last.size() - 1}) {
    INFO("cut after " << cut << " bytes of the last record");
    const std::string bytes = good + last.substr(0, cut);
    EventFileReader reader("torn");
    reader.Append(bytes);
    ScalarEvent ev;
    int events = 0;
    for (;;) {
      auto st = reader.Next(&ev);
      REQUIRE(st.ok());
      if (*st == ReadState::kNeedMore) break;
      ++events;
    }
    CHECK(events == 3);
    CHECK(reader.records().pending() == cut);
    const std::string torn = reader.TornTail();
    CHECK(torn.find("torn: byte offset " + std::to_string(good.size()) + ": torn record") !=
          std::string::npos);
    // Fed the rest, the same reader finishes the record: what follow relies on.
    reader.Append(last.substr(cut));
    auto st = reader.Next(&ev);
    REQUIRE(st.ok());
    REQUIRE(*st == ReadState::kRecord);
    CHECK(ev.step == 3);
    CHECK(reader.TornTail().empty());
  }

  const std::string dir = TempDir("torn");
  const std::string path = dir + "/events.out.tfevents.5.host";
  testing::WriteFile(path, good + last.substr(0, 20));
  std::string out, err;
  CHECK(ReplayCommand({path, "--summary"}, &out, &err) == 0);
  INFO(err);
  CHECK(err.find("warning: " + path + ": byte offset " + std::to_string(good.size()) +
                 ": torn record") != std::string::npos);
  CHECK(out.find("records 2,") != std::string::npos);
}

TEST_CASE("tensorboard: both scalar kinds - simple_value and one-element tensors",
          "[logs][tensorboard]") {
  std::string bytes = testing::FileVersionRecord(100.0);
  bytes += ScalarRecord(10, 101, "loss", 2.5, ScalarKind::kSimpleValue);
  bytes += ScalarRecord(10, 101, "grad_norm", 0.75, ScalarKind::kFloatVal);
  bytes += ScalarRecord(10, 101, "lr", 3e-4, ScalarKind::kDoubleVal);
  bytes += ScalarRecord(10, 101, "log_z", 12.125, ScalarKind::kFloatContent);
  bytes += ScalarRecord(10, 101, "nan_frac", 1e-9, ScalarKind::kDoubleContent);
  // Read past: text, and a tensor of two floats.
  bytes += testing::TextRecord(10, 101, "loss", "not a number");
  testing::ProtoWriter two, shape, dim, value;
  dim.Varint(1, 2);
  shape.Bytes(2, dim.str());
  two.Varint(1, 1);
  two.Bytes(2, shape.str());
  two.Bytes(5, std::string(8, '\0'));
  value.Bytes(1, "grad_norm");
  value.Bytes(8, two.str());
  bytes += testing::EventRecord(10, 101, {value.str()});
  bytes += testing::EventRecord(
      11, 102, {testing::ScalarValue("loss", std::nan(""), ScalarKind::kSimpleValue, true)});

  auto trace = ParseMetrics(bytes, "events.out.tfevents.x");
  REQUIRE(trace.ok());
  CHECK(trace->format() == MetricsFormat::kTensorBoard);
  REQUIRE(trace->size() == 2);
  CHECK(trace->Record(0).step == 10);
  CHECK(Value(*trace, 0, core::Signal::kLoss) == 2.5);
  CHECK(Value(*trace, 0, core::Signal::kGradNorm) == 0.75);
  CHECK(Value(*trace, 0, core::Signal::kLearningRate) == 3e-4);  // double: exact
  CHECK(Value(*trace, 0, core::Signal::kLogZ) == 12.125);
  CHECK(Value(*trace, 0, core::Signal::kNanFrac) == 1e-9);
  CHECK(std::isnan(Value(*trace, 1, core::Signal::kLoss)));  // NaN is a signal, kept
  CHECK_FALSE(trace->Record(1).Has(core::Signal::kGradNorm));
  CHECK(trace->warnings().empty());
}

TEST_CASE("tensorboard: tags map to signals by their usual names and by --map",
          "[logs][tensorboard]") {
  auto one = [](const std::vector<std::string>& tags, const ColumnMap& map) {
    std::string bytes = testing::FileVersionRecord(1);
    double v = 1;
    for (const std::string& tag : tags) bytes += ScalarRecord(1, 2, tag, v++);
    return ParseEventFiles({{"f", bytes}}, map);
  };
  for (const char* tag : {"loss", "train/loss", "train_loss", "Loss/train", "TRAIN/LOSS"}) {
    auto t = one({tag}, {});
    INFO(tag);
    REQUIRE(t.ok());
    CHECK(t->reported() == core::Bit(core::Signal::kLoss));
  }
  {
    auto t = one({"train/loss", "train/grad_norm", "learning_rate", "val/loss"}, {});
    REQUIRE(t.ok());
    CHECK(Value(*t, 0, core::Signal::kLoss) == 1);
    CHECK(Value(*t, 0, core::Signal::kGradNorm) == 2);
    CHECK(Value(*t, 0, core::Signal::kLearningRate) == 3);
  }
  {
    // --map wins over a usual name, which is then read past.
    auto map = ParseColumnMap("loss=train/total_loss,grad_norm=Optim/GN");
    REQUIRE(map.ok());
    auto t = one({"loss", "train/total_loss", "optim/gn"}, *map);
    REQUIRE(t.ok());
    CHECK(Value(*t, 0, core::Signal::kLoss) == 2);
    CHECK(Value(*t, 0, core::Signal::kGradNorm) == 3);
  }
  {
    auto t = one({"loss", "train/loss"}, {});
    REQUIRE_FALSE(t.ok());
    CHECK(std::string(t.status().message()).find("both read as loss") != std::string::npos);
  }
  {
    auto map = ParseColumnMap("loss=nope");
    REQUIRE(map.ok());
    auto t = one({"loss"}, *map);
    REQUIRE_FALSE(t.ok());
    CHECK(std::string(t.status().message()).find("\"nope\"") != std::string::npos);
  }
  {
    auto t = one({"accuracy", "epoch"}, {});
    REQUIRE_FALSE(t.ok());
    const std::string msg(t.status().message());
    CHECK(msg.find("\"accuracy\", \"epoch\"") != std::string::npos);
    CHECK(msg.find("--map") != std::string::npos);
  }
}

TEST_CASE("tensorboard: a folder of event files merges by step - the latest wall time wins",
          "[logs][tensorboard]") {
  const std::string dir = TempDir("merge");
  // The first run logs steps 0..9; a restart from step 5 logs 5..14 later.
  std::string first = testing::FileVersionRecord(1000), second = testing::FileVersionRecord(2000);
  for (int s = 0; s < 10; ++s) {
    first += ScalarRecord(s, 1000 + s, "train/loss", 10 + s);
    first += ScalarRecord(s, 1000 + s, "grad_norm", 1, ScalarKind::kFloatVal);
  }
  for (int s = 5; s < 15; ++s) second += ScalarRecord(s, 2000 + s, "train/loss", 100 + s);
  // Names in creation order; an unrelated file is left alone.
  testing::WriteFile(dir + "/events.out.tfevents.1000.host.1.0", first);
  testing::WriteFile(dir + "/events.out.tfevents.2000.host.2.0", second);
  testing::WriteFile(dir + "/notes.txt", "not an event file");
  std::filesystem::create_directories(dir + "/eval");

  ReadOptions options;
  auto t = ReadMetricsFile(dir, options);
  REQUIRE(t.ok());
  CHECK(t->format() == MetricsFormat::kTensorBoard);
  REQUIRE(t->size() == 15);
  for (size_t i = 0; i < 15; ++i) {
    INFO("row " << i);
    CHECK(t->Record(i).step == static_cast<int64_t>(i));
    CHECK(Value(*t, i, core::Signal::kLoss) == (i < 5 ? 10 + i : 100 + i));
    // grad_norm is kept where only the first run had it.
    CHECK(t->Record(i).Has(core::Signal::kGradNorm) == (i < 10));
  }

  SECTION("the same with the files' wall times the other way round") {
    // Wall time, not the file name, decides.
    std::string older;
    for (int s = 5; s < 15; ++s) older += ScalarRecord(s, 10 + s, "train/loss", 100 + s);
    testing::WriteFile(dir + "/events.out.tfevents.2000.host.2.0", older);
    auto u = ReadEventFiles(dir);
    REQUIRE(u.ok());
    CHECK(Value(*u, 7, core::Signal::kLoss) == 17);
    CHECK(Value(*u, 12, core::Signal::kLoss) == 112);
  }
  SECTION("a folder without event files names its run folders") {
    std::string out, err;
    CHECK(ReplayCommand({dir + "/eval"}, &out, &err) == 1);
    CHECK(err.find("no TensorBoard event files") != std::string::npos);
    std::filesystem::create_directories(dir + "/runs/a");
    CHECK(ReplayCommand({dir + "/runs"}, &out, &err) == 1);
    CHECK(err.find("one of \"a\"") != std::string::npos);
  }
}

TEST_CASE(
    "tensorboard: an event file is recognised by content under any name and by name with --format",
    "[logs][tensorboard]") {
  const std::string dir = TempDir("detect");
  const std::string bytes = testing::FileVersionRecord(1) + ScalarRecord(3, 2, "loss", 1);
  testing::WriteFile(dir + "/renamed.bin", bytes);
  auto t = ReadMetricsFile(dir + "/renamed.bin");
  REQUIRE(t.ok());
  CHECK(t->format() == MetricsFormat::kTensorBoard);
  MetricsFormat f;
  REQUIRE(ParseFormatName("tensorboard", &f));
  CHECK(f == MetricsFormat::kTensorBoard);
  // By name, a damaged first record is an event-file error, not a CSV one.
  testing::WriteFile(dir + "/events.out.tfevents.9.h", "garbage that is not a record");
  std::string out, err;
  CHECK(ReplayCommand({dir + "/events.out.tfevents.9.h"}, &out, &err) == 2);
  CHECK(err.find("byte offset 0") != std::string::npos);
}

// Runs a shell command; its exit status.
int Shell(const std::string& command) {
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST_CASE(
    "tensorboard: a folder written by an independent SummaryWriter-like writer replays through "
    "twctl",
    "[logs][tensorboard]") {
  const std::string dir = TempDir("pywriter");
  REQUIRE(Shell(std::string(TRAINWATCH_PYTHON) + " " + TFEVENTS_WRITER + " " + dir) == 0);

  auto t = ReadEventFiles(dir);
  REQUIRE(t.ok());
  REQUIRE(t->size() == 150);
  CHECK(t->reported() == (core::Bit(core::Signal::kLoss) | core::Bit(core::Signal::kGradNorm) |
                          core::Bit(core::Signal::kLearningRate)));
  // Steps 90..99 come from the restart, whose loss is 0.25 higher.
  const double first_run_95 = 4.0 * std::exp(-95 / 400.0);
  CHECK(Value(*t, 95, core::Signal::kLoss) == Approx(first_run_95 + 0.25).epsilon(1e-6));
  CHECK(Value(*t, 60, core::Signal::kGradNorm) == Approx(1.04).epsilon(1e-6));
  CHECK(Value(*t, 10, core::Signal::kLearningRate) == Approx(3e-4 * 11 / 50.0).epsilon(1e-12));
  CHECK(std::isnan(Value(*t, 120, core::Signal::kLoss)));

  // The real binary, on the folder: the NaN loss halts at step 120.
  const std::string out = dir + ".out", err = dir + ".err";
  const int code =
      Shell(std::string(TWCTL_PATH) + " replay " + dir + " -o json >" + out + " 2>" + err);
  CHECK(code == 0);
  std::string json;
  {
    std::ifstream in(out);
    json.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  INFO(json);
  CHECK(json.find("{\"step\":120,\"tier\":3,\"action\":\"halt\"") != std::string::npos);
}

// The tags a TensorBoard writer would give replay's signals.
const char* TagOf(core::Signal s) {
  switch (s) {
    case core::Signal::kLoss: return "train/loss";
    case core::Signal::kGradNorm: return "train/grad_norm";
    case core::Signal::kLogZ: return "train/log_z";
    case core::Signal::kNanFrac: return "train/nan_frac";
    case core::Signal::kLearningRate: return "train/lr";
    default: return nullptr;
  }
}

// What a verdict is, its reason's wording (which prints the values) left out.
std::vector<std::string> Verdicts(const ReplayResult& r) {
  std::vector<std::string> out;
  for (const core::Event& e : r.events) {
    out.push_back(absl::StrCat(e.step, " tier ", e.tier, " ", core::ActionName(e.action), " ",
                               core::EventKindName(e.kind), " onset ", e.onset_step,
                               " checkpoint ", e.recommended_checkpoint_step));
  }
  return out;
}

TEST_CASE("tensorboard: the four real logs give the same verdicts when converted to event files",
          "[logs][tensorboard][realdata]") {
  const std::string dir = TempDir("realdata");
  size_t events = 0;
  for (const char* name : {"llmc-gpt2-124m.main.log", "modded-nanogpt-1p5b.log",
                           "parameter-golf-behemoth-v10.log", "parameter-golf-bitnet.train.log"}) {
    auto log = ReadMetricsFile(std::string(TRAINWATCH_REALDATA_DIR) + "/" + name);
    REQUIRE(log.ok());
    auto want = Replay(*log, core::RuleConfig());
    REQUIRE(want.ok());
    events += want->events.size();
    // One Event per step with every signal the log reported: as torch's
    // add_scalar writes it by default (simple_value, a float), and with
    // double_precision=True (a DT_DOUBLE tensor), whose values are exact.
    for (ScalarKind kind : {ScalarKind::kSimpleValue, ScalarKind::kDoubleVal}) {
      const bool exact = kind == ScalarKind::kDoubleVal;
      INFO(name << (exact ? " as doubles" : " as floats"));
      std::string bytes = testing::FileVersionRecord(0);
      for (size_t i = 0; i < log->size(); ++i) {
        const core::StepRecord r = log->Record(i);
        std::vector<std::string> values;
        for (int k = 0; k < core::kNumSignals; ++k) {
          const auto s = static_cast<core::Signal>(k);
          if (TagOf(s) != nullptr && r.Has(s)) {
            values.push_back(testing::ScalarValue(TagOf(s), r.Get(s), kind));
          }
        }
        bytes += testing::EventRecord(r.step, static_cast<double>(i), values);
      }
      const std::string file =
          dir + "/events.out.tfevents.1." + name + (exact ? ".double" : ".float");
      testing::WriteFile(file, bytes);
      auto converted = ReadMetricsFile(file);
      INFO(converted.status());
      REQUIRE(converted.ok());
      CHECK(converted->format() == MetricsFormat::kTensorBoard);
      REQUIRE(converted->size() == log->size());
      auto got = Replay(*converted, core::RuleConfig());
      REQUIRE(got.ok());
      CHECK(Verdicts(*got) == Verdicts(*want));
      // Exact values: the whole output, reasons and summary too.
      if (exact) {
        CHECK(FormatEventsJson(*got) == FormatEventsJson(*want));
        CHECK(FormatSummaryJson(*got) == FormatSummaryJson(*want));
      }
    }
  }
  CHECK(events > 0);  // the logs have verdicts to compare
}

}  // namespace
}  // namespace trainwatch::logs
