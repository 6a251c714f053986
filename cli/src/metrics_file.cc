#include "trainwatch/cli/metrics_file.h"

#include <charconv>
#include <cmath>
#include <fstream>
#include <iterator>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "trainwatch/core/json.h"

namespace trainwatch::cli {

using core::Signal;

core::StepRecord Trace::Record(size_t i) const {
  const Row& r = rows_[i];
  core::StepRecord rec;
  rec.step = r.step;
  for (int s = 0; s < core::kNumSignals; ++s) {
    if (r.present & (1u << s)) rec.Set(static_cast<Signal>(s), r.values[s]);
  }
  rec.shards = absl::MakeConstSpan(shards_.data() + r.shard_begin, r.shard_count);
  if (r.checkpoint >= 0) rec.checkpoint_uri = checkpoints_[static_cast<size_t>(r.checkpoint)];
  return rec;
}

namespace {

constexpr Signal kRequired[] = {Signal::kLoss, Signal::kGradNorm, Signal::kLogZ,
                                Signal::kNanFrac};

absl::Status At(absl::string_view source, int line, int column, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrFormat("%s:%d:%d: %s", source, line, column, what));
}

bool SignalByName(absl::string_view name, Signal* out) {
  for (int s = 0; s < core::kNumSignals; ++s) {
    if (core::SignalName(static_cast<Signal>(s)) == name) {
      *out = static_cast<Signal>(s);
      return true;
    }
  }
  return false;
}

bool ParseDouble(absl::string_view text, double* out) {
  if (text.empty()) return false;
  if (text.front() == '+') text.remove_prefix(1);
  const auto res = std::from_chars(text.data(), text.data() + text.size(), *out);
  if (res.ec == std::errc::result_out_of_range && res.ptr == text.data() + text.size()) {
    *out = std::strtod(std::string(text).c_str(), nullptr);
    return true;
  }
  return res.ec == std::errc() && res.ptr == text.data() + text.size();
}

template <typename Int>
bool ParseInt(absl::string_view text, Int* out) {
  if (text.empty()) return false;
  const auto res = std::from_chars(text.data(), text.data() + text.size(), *out);
  return res.ec == std::errc() && res.ptr == text.data() + text.size();
}

// Shard ids separated by ';' (spaces allowed around them).
absl::Status ParseShards(absl::string_view text, absl::string_view source, int line,
                         int column, std::vector<uint64_t>* out) {
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(';', pos);
    if (end == absl::string_view::npos) end = text.size();
    const absl::string_view id = absl::StripAsciiWhitespace(text.substr(pos, end - pos));
    uint64_t v;
    if (!id.empty()) {
      if (!ParseInt(id, &v)) {
        return At(source, line, column + static_cast<int>(pos),
                  absl::StrCat("shard id \"", id, "\" is not a non-negative integer"));
      }
      out->push_back(v);
    }
    pos = end + 1;
  }
  return absl::OkStatus();
}

}  // namespace

// Accumulates rows and enforces the rules shared by both formats.
class TraceBuilder {
 public:
  explicit TraceBuilder(absl::string_view source) : source_(source) {}

  Trace::Row& NewRow(int line) {
    trace_.rows_.emplace_back();
    Trace::Row& r = trace_.rows_.back();
    r.step = 0;
    r.values.fill(0.0);
    r.present = 0;
    r.shard_begin = static_cast<uint32_t>(trace_.shards_.size());
    r.shard_count = 0;
    r.checkpoint = -1;
    r.line = line;
    return r;
  }

  absl::Status SetStep(Trace::Row& r, int64_t step, int column) {
    if (step < 0) return At(source_, r.line, column, "step must be >= 0");
    if (have_last_ && step <= last_step_) {
      return At(source_, r.line, column,
                absl::StrFormat("step %d %s step %d on line %d: steps must strictly increase",
                                step, step == last_step_ ? "repeats" : "comes after",
                                last_step_, last_line_));
    }
    r.step = step;
    have_last_ = true;
    last_step_ = step;
    last_line_ = r.line;
    return absl::OkStatus();
  }

  void SetValue(Trace::Row& r, Signal s, double v) {
    r.values[static_cast<int>(s)] = v;
    r.present |= core::Bit(s);
    if (std::isfinite(v)) trace_.reported_ |= core::Bit(s);
  }

  absl::Status AddShards(Trace::Row& r, absl::string_view text, int column) {
    absl::Status s = ParseShards(text, source_, r.line, column, &trace_.shards_);
    r.shard_count = static_cast<uint32_t>(trace_.shards_.size() - r.shard_begin);
    return s;
  }
  void AddShard(Trace::Row& r, uint64_t id) {
    trace_.shards_.push_back(id);
    r.shard_count = static_cast<uint32_t>(trace_.shards_.size() - r.shard_begin);
  }

  void SetCheckpoint(Trace::Row& r, absl::string_view uri) {
    if (uri.empty()) return;
    r.checkpoint = static_cast<int32_t>(trace_.checkpoints_.size());
    trace_.checkpoints_.emplace_back(uri);
  }

  absl::StatusOr<Trace> Finish() {
    if (trace_.rows_.empty()) {
      return At(source_, 1, 1, "no records: the file holds no step");
    }
    // A signal never reported with a finite value is unknown, not a failure.
    const uint32_t unknown = ~trace_.reported_;
    for (Trace::Row& r : trace_.rows_) r.present &= ~unknown;
    return std::move(trace_);
  }

 private:
  absl::string_view source_;
  Trace trace_;
  bool have_last_ = false;
  int64_t last_step_ = 0;
  int last_line_ = 0;
};

namespace {

struct CsvField {
  std::string text;
  int column;
};

// Splits one CSV line (RFC 4180 quoting, no embedded newlines).
absl::Status SplitCsv(absl::string_view line, absl::string_view source, int line_no,
                      std::vector<CsvField>* out) {
  out->clear();
  size_t i = 0;
  for (;;) {
    CsvField f;
    f.column = static_cast<int>(i) + 1;
    if (i < line.size() && line[i] == '"') {
      ++i;
      for (;;) {
        if (i >= line.size()) return At(source, line_no, f.column, "unterminated quoted field");
        if (line[i] == '"') {
          if (i + 1 < line.size() && line[i + 1] == '"') {
            f.text.push_back('"');
            i += 2;
            continue;
          }
          ++i;
          break;
        }
        f.text.push_back(line[i++]);
      }
      if (i < line.size() && line[i] != ',') {
        return At(source, line_no, static_cast<int>(i) + 1,
                  "unexpected text after a quoted field");
      }
    } else {
      const size_t end = std::min(line.find(',', i), line.size());
      f.text = std::string(absl::StripAsciiWhitespace(line.substr(i, end - i)));
      i = end;
    }
    out->push_back(std::move(f));
    if (i >= line.size()) return absl::OkStatus();
    ++i;  // the comma
  }
}

absl::StatusOr<Trace> ParseCsv(absl::string_view content, absl::string_view source) {
  TraceBuilder b(source);
  enum class Col { kStep, kSignal, kShard, kCheckpoint, kIgnored };
  struct Column {
    Col kind;
    Signal signal;
  };
  std::vector<Column> columns;
  std::vector<CsvField> fields;
  int line_no = 0;
  bool have_header = false;
  size_t pos = 0;
  while (pos < content.size()) {
    size_t end = content.find('\n', pos);
    if (end == absl::string_view::npos) end = content.size();
    absl::string_view line = content.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    if (absl::Status s = SplitCsv(line, source, line_no, &fields); !s.ok()) return s;
    if (!have_header) {
      have_header = true;
      bool seen_step = false;
      uint32_t seen = 0;
      for (const CsvField& f : fields) {
        const std::string name = absl::AsciiStrToLower(f.text);
        Column c{Col::kIgnored, Signal::kLoss};
        Signal s;
        if (name == "step") {
          if (seen_step) return At(source, line_no, f.column, "column \"step\" appears twice");
          c.kind = Col::kStep;
          seen_step = true;
        } else if (name == "shard" || name == "shards") {
          c.kind = Col::kShard;
        } else if (name == "checkpoint") {
          c.kind = Col::kCheckpoint;
        } else if (SignalByName(name, &s)) {
          if (seen & core::Bit(s)) {
            return At(source, line_no, f.column, absl::StrCat("column \"", name, "\" appears twice"));
          }
          seen |= core::Bit(s);
          c = Column{Col::kSignal, s};
        }
        // Anything else (loss_ema_ratio, which the engine derives; a
        // trainer's extra columns) is read past.
        columns.push_back(c);
      }
      std::vector<std::string> missing;
      if (!seen_step) missing.push_back("step");
      for (Signal s : kRequired) {
        if (!(seen & core::Bit(s))) missing.emplace_back(core::SignalName(s));
      }
      if (!missing.empty()) {
        return At(source, line_no, 1,
                  absl::StrCat("header lacks the column", missing.size() > 1 ? "s " : " ",
                               absl::StrJoin(missing, ", "),
                               " (expected step, loss, grad_norm, log_z, nan_frac)"));
      }
      continue;
    }
    if (fields.size() != columns.size()) {
      return At(source, line_no, 1,
                absl::StrFormat("%d fields, but the header names %d columns", fields.size(),
                                columns.size()));
    }
    auto& row = b.NewRow(line_no);
    for (size_t i = 0; i < fields.size(); ++i) {
      const CsvField& f = fields[i];
      switch (columns[i].kind) {
        case Col::kStep: {
          int64_t step;
          if (!ParseInt(f.text, &step)) {
            return At(source, line_no, f.column,
                      absl::StrCat("step \"", f.text, "\" is not an integer"));
          }
          if (absl::Status s = b.SetStep(row, step, f.column); !s.ok()) return s;
          break;
        }
        case Col::kSignal: {
          if (f.text.empty()) break;  // unknown at this step
          double v;
          if (!ParseDouble(f.text, &v)) {
            return At(source, line_no, f.column,
                      absl::StrCat(core::SignalName(columns[i].signal), " \"", f.text,
                                   "\" is not a number"));
          }
          b.SetValue(row, columns[i].signal, v);
          break;
        }
        case Col::kShard:
          if (absl::Status s = b.AddShards(row, f.text, f.column); !s.ok()) return s;
          break;
        case Col::kCheckpoint:
          b.SetCheckpoint(row, f.text);
          break;
        case Col::kIgnored:
          break;
      }
    }
  }
  if (!have_header) {
    return At(source, 1, 1,
              "empty file: expected a header naming step, loss, grad_norm, log_z, nan_frac");
  }
  return b.Finish();
}

absl::StatusOr<Trace> ParseJsonLines(absl::string_view content, absl::string_view source) {
  TraceBuilder b(source);
  uint32_t keys_seen = 0;
  int line_no = 0;
  size_t pos = 0;
  while (pos < content.size()) {
    size_t end = content.find('\n', pos);
    if (end == absl::string_view::npos) end = content.size();
    const absl::string_view line = content.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    absl::StatusOr<core::JsonValue> v = core::ParseJson(line, source, line_no);
    if (!v.ok()) return v.status();
    if (v->type != core::JsonValue::Type::kObject) {
      return At(source, line_no, v->column, "each line must be a JSON object");
    }
    auto& row = b.NewRow(line_no);
    const core::JsonValue* step = v->Find("step");
    if (step == nullptr) return At(source, line_no, 1, "missing key \"step\"");
    if (step->type != core::JsonValue::Type::kNumber || !std::isfinite(step->number) ||
        step->number != std::floor(step->number)) {
      return At(source, line_no, step->column, "step must be an integer");
    }
    if (absl::Status s = b.SetStep(row, static_cast<int64_t>(step->number), step->column);
        !s.ok()) {
      return s;
    }
    for (const auto& [key, val] : v->object) {
      Signal sig;
      if (key == "step") continue;
      if (SignalByName(key, &sig)) {
        keys_seen |= core::Bit(sig);
        if (val.type == core::JsonValue::Type::kNull) continue;
        if (val.type == core::JsonValue::Type::kString) {
          // "nan", "inf" as strings are what some writers emit.
          double d;
          if (!ParseDouble(val.string, &d)) {
            return At(source, line_no, val.column,
                      absl::StrCat(key, " \"", val.string, "\" is not a number"));
          }
          b.SetValue(row, sig, d);
          continue;
        }
        if (val.type != core::JsonValue::Type::kNumber) {
          return At(source, line_no, val.column, absl::StrCat(key, " must be a number"));
        }
        b.SetValue(row, sig, val.number);
      } else if (key == "shard" || key == "shards") {
        if (val.type == core::JsonValue::Type::kString) {
          if (absl::Status s = b.AddShards(row, val.string, val.column); !s.ok()) return s;
        } else if (val.type == core::JsonValue::Type::kNumber ||
                   val.type == core::JsonValue::Type::kArray) {
          const std::vector<core::JsonValue> single =
              val.type == core::JsonValue::Type::kNumber ? std::vector<core::JsonValue>{val}
                                                        : std::vector<core::JsonValue>{};
          for (const core::JsonValue& id : val.array.empty() ? single : val.array) {
            if (id.type != core::JsonValue::Type::kNumber || id.number < 0 ||
                id.number != std::floor(id.number)) {
              return At(source, line_no, id.column,
                        "shard ids must be non-negative integers");
            }
            b.AddShard(row, static_cast<uint64_t>(id.number));
          }
        } else if (val.type != core::JsonValue::Type::kNull) {
          return At(source, line_no, val.column,
                    "shard must be an id, a list of ids or a string \"a;b\"");
        }
      } else if (key == "checkpoint") {
        if (val.type == core::JsonValue::Type::kString) {
          b.SetCheckpoint(row, val.string);
        } else if (val.type != core::JsonValue::Type::kNull) {
          return At(source, line_no, val.column, "checkpoint must be a string (a uri)");
        }
      }
      // Other keys are read past, as extra CSV columns are.
    }
  }
  std::vector<std::string> missing;
  for (Signal s : kRequired) {
    if (!(keys_seen & core::Bit(s))) missing.emplace_back(core::SignalName(s));
  }
  if (line_no > 0 && !missing.empty()) {
    return At(source, 1, 1,
              absl::StrCat("no line has the key", missing.size() > 1 ? "s " : " ",
                           absl::StrJoin(missing, ", "),
                           " (expected step, loss, grad_norm, log_z, nan_frac)"));
  }
  return b.Finish();
}

}  // namespace

absl::StatusOr<Trace> ParseMetrics(absl::string_view content, absl::string_view source,
                                   MetricsFormat format) {
  if (format == MetricsFormat::kAuto) {
    const absl::string_view head = absl::StripLeadingAsciiWhitespace(content);
    if (head.empty()) {
      return At(source, 1, 1,
                "empty file: expected a CSV header or JSON lines with step, loss, "
                "grad_norm, log_z, nan_frac");
    }
    format = head.front() == '{' ? MetricsFormat::kJsonLines : MetricsFormat::kCsv;
  }
  return format == MetricsFormat::kCsv ? ParseCsv(content, source)
                                       : ParseJsonLines(content, source);
}

absl::StatusOr<Trace> ReadMetricsFile(const std::string& path, MetricsFormat format) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  return ParseMetrics(content, path, format);
}

}  // namespace trainwatch::cli
