#include "trainwatch/logs/tensorboard.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <unordered_map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tensorboard_event.pb.h"
#include "trainwatch/logs/trace_builder.h"

namespace trainwatch::logs {

using core::Signal;

namespace {

// The reflected Castagnoli polynomial.
constexpr uint32_t kCrc32cPoly = 0x82F63B78u;
constexpr uint32_t kMaskDelta = 0xa282ead8u;
// A record's header (length and its CRC) and footer (the data's CRC).
constexpr size_t kHeaderBytes = 12;
constexpr size_t kFooterBytes = 4;

constexpr std::array<uint32_t, 256> MakeCrc32cTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kCrc32cPoly : c >> 1;
    table[i] = c;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kCrc32cTable = MakeCrc32cTable();

// Little-endian loads, whatever the host's byte order.
uint64_t LoadLe(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

void StoreLe(uint64_t v, int bytes, std::string* out) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

uint32_t ExtendCrc32c(uint32_t crc, absl::string_view data) {
  uint32_t c = ~crc;
  for (char ch : data) c = kCrc32cTable[(c ^ static_cast<unsigned char>(ch)) & 0xff] ^ (c >> 8);
  return ~c;
}

uint32_t Crc32c(absl::string_view data) { return ExtendCrc32c(0, data); }

uint32_t MaskCrc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + kMaskDelta; }

uint32_t UnmaskCrc32c(uint32_t masked) {
  const uint32_t rot = masked - kMaskDelta;
  return (rot >> 17) | (rot << 15);
}

std::string FrameRecord(absl::string_view data) {
  std::string out;
  out.reserve(kHeaderBytes + data.size() + kFooterBytes);
  StoreLe(data.size(), 8, &out);
  StoreLe(MaskCrc32c(Crc32c(out)), 4, &out);
  out.append(data.data(), data.size());
  StoreLe(MaskCrc32c(Crc32c(data)), 4, &out);
  return out;
}

void RecordReader::Append(absl::string_view bytes) {
  // Drop what was consumed once it is most of the buffer, so a long follow
  // keeps about one record in memory; views from Next() end here anyway.
  if (pos_ > 0 && pos_ >= buffer_.size() / 2) {
    buffer_.erase(0, pos_);
    consumed_ += pos_;
    pos_ = 0;
  }
  buffer_.append(bytes.data(), bytes.size());
}

int64_t RecordReader::pending_length() const {
  if (pending() < kHeaderBytes) return -1;
  const char* p = buffer_.data() + pos_;
  if (MaskCrc32c(Crc32c(absl::string_view(p, 8))) != LoadLe(p + 8, 4)) return -1;
  return static_cast<int64_t>(LoadLe(p, 8));
}

absl::StatusOr<ReadState> RecordReader::Next(absl::string_view* record) {
  if (!error_.ok()) return error_;
  if (pending() < kHeaderBytes) return ReadState::kNeedMore;
  const char* p = buffer_.data() + pos_;
  const uint64_t length = LoadLe(p, 8);
  const uint32_t stored_length_crc = static_cast<uint32_t>(LoadLe(p + 8, 4));
  const uint32_t length_crc = MaskCrc32c(Crc32c(absl::string_view(p, 8)));
  if (stored_length_crc != length_crc) {
    error_ = absl::DataLossError(absl::StrFormat(
        "%s: byte offset %d: corrupt record: the CRC of its length does not match (stored "
        "0x%08x, computed 0x%08x)",
        source_, offset(), stored_length_crc, length_crc));
    return error_;
  }
  if (length > pending() - kHeaderBytes || pending() - kHeaderBytes - length < kFooterBytes) {
    return ReadState::kNeedMore;
  }
  const absl::string_view data(p + kHeaderBytes, length);
  const uint32_t stored_crc = static_cast<uint32_t>(LoadLe(p + kHeaderBytes + length, 4));
  const uint32_t crc = MaskCrc32c(Crc32c(data));
  if (stored_crc != crc) {
    error_ = absl::DataLossError(absl::StrFormat(
        "%s: byte offset %d: corrupt record: the CRC of its %d data bytes does not match "
        "(stored 0x%08x, computed 0x%08x)",
        source_, offset(), length, stored_crc, crc));
    return error_;
  }
  *record = data;
  pos_ += kHeaderBytes + length + kFooterBytes;
  return ReadState::kRecord;
}

namespace {

// The one value of a tensor holding exactly one float or double; false for
// anything else (other dtypes, more elements, no value).
bool TensorScalar(const tensorboard::TensorProto& t, double* out) {
  if (t.tensor_shape().unknown_rank()) return false;
  for (const auto& dim : t.tensor_shape().dim()) {
    if (dim.size() != 1) return false;
  }
  const std::string& raw = t.tensor_content();
  switch (t.dtype()) {
    case tensorboard::DT_FLOAT:
      if (t.float_val_size() == 1) {
        *out = t.float_val(0);
      } else if (raw.size() == sizeof(float) && t.float_val_size() == 0) {
        const uint32_t bits = static_cast<uint32_t>(LoadLe(raw.data(), 4));
        float f;
        std::memcpy(&f, &bits, sizeof f);
        *out = f;
      } else {
        return false;
      }
      return true;
    case tensorboard::DT_DOUBLE:
      if (t.double_val_size() == 1) {
        *out = t.double_val(0);
      } else if (raw.size() == sizeof(double) && t.double_val_size() == 0) {
        const uint64_t bits = LoadLe(raw.data(), 8);
        std::memcpy(out, &bits, sizeof *out);
      } else {
        return false;
      }
      return true;
    default:
      return false;
  }
}

}  // namespace

absl::Status DecodeScalarEvent(absl::string_view record, ScalarEvent* out) {
  tensorboard::Event event;
  // protobuf's parser takes an int size; no scalar event comes near it.
  if (record.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("a record of ", record.size(), " bytes is too large for an Event"));
  }
  if (!event.ParseFromArray(record.data(), static_cast<int>(record.size()))) {
    return absl::InvalidArgumentError("the record is not a TensorBoard Event (bad protobuf)");
  }
  out->step = event.step();
  out->wall_time = event.wall_time();
  out->values.clear();
  if (!event.has_summary()) return absl::OkStatus();
  for (const tensorboard::Summary::Value& v : event.summary().value()) {
    double value;
    if (v.value_case() == tensorboard::Summary::Value::kSimpleValue) {
      value = v.simple_value();
    } else if (v.value_case() != tensorboard::Summary::Value::kTensor ||
               !TensorScalar(v.tensor(), &value)) {
      continue;
    }
    out->values.push_back({v.tag(), value});
  }
  return absl::OkStatus();
}

absl::StatusOr<ReadState> EventFileReader::Next(ScalarEvent* event) {
  const uint64_t at = records_.offset();
  absl::string_view record;
  absl::StatusOr<ReadState> state = records_.Next(&record);
  if (!state.ok() || *state == ReadState::kNeedMore) return state;
  if (absl::Status s = DecodeScalarEvent(record, event); !s.ok()) {
    return absl::DataLossError(
        absl::StrFormat("%s: byte offset %d: %s", records_.source(), at, s.message()));
  }
  ++events_;
  return ReadState::kRecord;
}

std::string EventFileReader::TornTail() const {
  if (records_.pending() == 0) return std::string();
  const int64_t length = records_.pending_length();
  const std::string expected =
      length >= 0 ? absl::StrCat("a record of ", length + kHeaderBytes + kFooterBytes, " bytes")
                  : absl::StrCat("a ", kHeaderBytes, "-byte record header");
  return absl::StrFormat(
      "%s: byte offset %d: torn record: the file ends %d bytes into %s (the writer stopped "
      "or is still writing); read up to it",
      records_.source(), records_.offset(), records_.pending(), expected);
}

bool IsEventFileName(absl::string_view file_name) {
  const size_t slash = file_name.rfind('/');
  if (slash != absl::string_view::npos) file_name.remove_prefix(slash + 1);
  // TensorBoard itself loads any file whose name contains "tfevents".
  return absl::StrContains(file_name, "tfevents");
}

bool LooksLikeEventFile(absl::string_view content) {
  return content.size() >= kHeaderBytes &&
         MaskCrc32c(Crc32c(content.substr(0, 8))) == LoadLe(content.data() + 8, 4);
}


int SignalOfTag(absl::string_view tag, const ColumnMap& map, Signal* out) {
  const std::string lower = absl::AsciiStrToLower(tag);
  int entry = -1;
  for (size_t m = 0; m < map.size(); ++m) {
    if (absl::AsciiStrToLower(map[m].second) == lower) {
      *out = map[m].first;
      entry = static_cast<int>(m);
    }
  }
  if (entry >= 0) return entry;
  uint32_t mapped = 0;
  for (const auto& [sig, t] : map) mapped |= core::Bit(sig);
  return SignalByAlias(lower, out) && !(mapped & core::Bit(*out)) ? kUsualTagName : kUnmappedTag;
}

namespace {

// One scalar as read, before merging.
struct Point {
  int64_t step;
  double wall_time;
  uint32_t tag;
  int record;  // 1-based record number in its file, for Trace::line
  double value;
};

std::string TagList(const std::vector<std::string>& tags) {
  constexpr size_t kShown = 12;
  std::vector<std::string> quoted;
  for (size_t i = 0; i < tags.size() && i < kShown; ++i) {
    quoted.push_back(absl::StrCat("\"", tags[i], "\""));
  }
  std::string out = absl::StrJoin(quoted, ", ");
  if (tags.size() > kShown) absl::StrAppend(&out, " and ", tags.size() - kShown, " more");
  return out;
}

}  // namespace

absl::StatusOr<Trace> ParseEventFiles(const std::vector<EventFileData>& files, const ColumnMap& map,
                                      absl::string_view label) {
  const std::string run = !label.empty()  ? std::string(label)
                          : files.empty() ? "<no files>"
                                          : files[0].source;
  std::vector<Point> points;
  std::vector<std::string> tags;
  std::unordered_map<std::string, uint32_t> tag_ids;
  std::vector<std::string> warnings;
  ScalarEvent event;
  for (const EventFileData& f : files) {
    EventFileReader reader(f.source);
    reader.Append(f.content);
    for (;;) {
      const uint64_t at = reader.records().offset();
      absl::StatusOr<ReadState> state = reader.Next(&event);
      if (!state.ok()) return state.status();
      if (*state == ReadState::kNeedMore) break;
      if (event.values.empty()) continue;
      if (event.step < 0) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: byte offset %d: step %d is negative", f.source, at, event.step));
      }
      for (ScalarEvent::Value& v : event.values) {
        auto [it, added] = tag_ids.emplace(v.tag, static_cast<uint32_t>(tags.size()));
        if (added) tags.push_back(v.tag);
        points.push_back(
            {event.step, event.wall_time, it->second, static_cast<int>(reader.events()), v.value});
      }
    }
    if (std::string torn = reader.TornTail(); !torn.empty()) warnings.push_back(std::move(torn));
  }
  if (points.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(run, ": no scalar summaries in the event file",
                                                   files.size() == 1 ? "" : "s",
                                                   ": nothing to replay"));
  }

  // Tag -> signal: --map first; a usual name only for a signal --map leaves
  // alone. Two tags for one signal is ambiguous, as two CSV columns are.
  std::vector<int> signal_of(tags.size(), -1);
  std::array<int, core::kNumSignals> tag_of;
  tag_of.fill(-1);
  std::vector<bool> map_used(map.size(), false);
  for (size_t t = 0; t < tags.size(); ++t) {
    Signal s;
    const int entry = SignalOfTag(tags[t], map, &s);
    if (entry == kUnmappedTag) continue;
    if (entry >= 0) map_used[static_cast<size_t>(entry)] = true;
    const int si = static_cast<int>(s);
    if (tag_of[si] >= 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: tags \"%s\" and \"%s\" both read as %s; choose one with --map %s=TAG", run,
          tags[tag_of[si]], tags[t], core::SignalName(s), core::SignalName(s)));
    }
    tag_of[si] = static_cast<int>(t);
    signal_of[t] = si;
  }
  for (size_t m = 0; m < map.size(); ++m) {
    if (!map_used[m]) {
      return absl::InvalidArgumentError(
          absl::StrCat(run, ": --map names tag \"", map[m].second,
                       "\", which no scalar summary has (tags: ", TagList(tags), ")"));
    }
  }
  if (tag_of[static_cast<int>(Signal::kLoss)] < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        run, ": no scalar tag recognised as the loss (tags: ", TagList(tags),
        "); name it with --map, e.g. --map loss=train/loss (the names read without it: "
        "docs/log-formats.md)"));
  }

  points.erase(std::remove_if(points.begin(), points.end(),
                              [&](const Point& p) { return signal_of[p.tag] < 0; }),
               points.end());
  // Stable: for equal step and wall time, file order then record order stays.
  std::stable_sort(points.begin(), points.end(), [](const Point& a, const Point& b) {
    return a.step != b.step ? a.step < b.step : a.wall_time < b.wall_time;
  });
  TraceBuilder b(run);
  for (const std::string& w : warnings) b.AddWarning(w);
  for (size_t i = 0; i < points.size();) {
    size_t end = i;
    std::array<double, core::kNumSignals> value{};
    uint32_t present = 0;
    for (; end < points.size() && points[end].step == points[i].step; ++end) {
      const int si = signal_of[points[end].tag];
      value[si] = points[end].value;  // the latest wall time wins
      present |= 1u << si;
    }
    auto& row = b.NewRow(points[i].record);
    if (absl::Status s = b.SetStep(row, points[i].step, 1); !s.ok()) return s;
    for (int si = 0; si < core::kNumSignals; ++si) {
      if (present & (1u << si)) b.SetValue(row, static_cast<Signal>(si), value[si]);
    }
    i = end;
  }
  return b.Finish(MetricsFormat::kTensorBoard);
}

absl::StatusOr<Trace> ReadEventFiles(const std::string& path, const ColumnMap& map) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<std::string> paths;
  if (fs::is_directory(path, ec)) {
    std::vector<std::string> subfolders;
    for (const fs::directory_entry& e : fs::directory_iterator(path, ec)) {
      const std::string name = e.path().filename().string();
      std::error_code entry_ec;
      if (e.is_directory(entry_ec)) {
        subfolders.push_back(name);
      } else if (IsEventFileName(name)) {
        paths.push_back(e.path().string());
      }
    }
    if (ec) {
      return absl::NotFoundError(absl::StrCat(path, ": cannot list: ", ec.message()));
    }
    if (paths.empty()) {
      std::sort(subfolders.begin(), subfolders.end());
      return absl::NotFoundError(absl::StrCat(
          path, ": no TensorBoard event files (events.out.tfevents.*)",
          subfolders.empty() ? ""
                             : absl::StrCat("; TensorBoard keeps one run per folder: replay "
                                            "one of ",
                                            TagList(subfolders))));
    }
    // Writers put the creation time first in the name: name order is
    // creation order, which breaks ties in the merge.
    std::sort(paths.begin(), paths.end());
  } else {
    paths.push_back(path);
  }
  std::vector<std::string> contents(paths.size());
  std::vector<EventFileData> files;
  for (size_t i = 0; i < paths.size(); ++i) {
    std::ifstream in(paths[i], std::ios::binary);
    if (!in) {
      return absl::NotFoundError(absl::StrCat(paths[i], ": cannot open: ", std::strerror(errno)));
    }
    contents[i].assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (in.bad()) return absl::DataLossError(absl::StrCat(paths[i], ": read error"));
    files.push_back({paths[i], contents[i]});
  }
  return ParseEventFiles(files, map, path);
}

}  // namespace trainwatch::logs
