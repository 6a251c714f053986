#include "trainwatch/logs/trace_builder.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "trainwatch/logs/lines.h"
#include "trainwatch/core/shard_names.h"

namespace trainwatch::logs {

using core::Signal;



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
  if (ParseDecimalFast(text, out)) return true;
  const auto res = std::from_chars(text.data(), text.data() + text.size(), *out);
  if (res.ec == std::errc::result_out_of_range && res.ptr == text.data() + text.size()) {
    *out = std::strtod(std::string(text).c_str(), nullptr);
    return true;
  }
  return res.ec == std::errc() && res.ptr == text.data() + text.size();
}

namespace {

template <typename Int>
bool ParseInt(absl::string_view text, Int* out) {
  if (text.empty()) return false;
  const auto res = std::from_chars(text.data(), text.data() + text.size(), *out);
  return res.ec == std::errc() && res.ptr == text.data() + text.size();
}

// An entry of digits only is an id (which must fit in 64 bits); anything
// else is a name ("shard-00500:0"), bounded as agent.proto bounds names.
absl::Status ParseShard(absl::string_view id, absl::string_view source, int line, int column,
                        Trace::ShardIds* ids, std::vector<std::string>* names) {
  if (absl::c_all_of(id, [](char ch) { return absl::ascii_isdigit(static_cast<unsigned char>(ch)); })) {
    uint64_t v;
    if (!ParseInt(id, &v)) {
      return At(source, line, column,
                absl::StrCat("shard id \"", id, "\" does not fit in 64 bits"));
    }
    ids->push_back(v);
    return absl::OkStatus();
  }
  if (absl::Status s = core::CheckShardName("shard", id); !s.ok()) {
    return At(source, line, column, s.message());
  }
  names->emplace_back(id);
  return absl::OkStatus();
}

}  // namespace

bool ParseInt64(absl::string_view text, int64_t* out) { return ParseInt(text, out); }
bool ParseUint64(absl::string_view text, uint64_t* out) { return ParseInt(text, out); }


absl::Status TraceBuilder::AddShards(Row& r, absl::string_view text, int column) {
  // Entries separated by ';' (spaces allowed around them), ids or names.
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(';', pos);
    if (end == absl::string_view::npos) end = text.size();
    const absl::string_view id = absl::StripAsciiWhitespace(text.substr(pos, end - pos));
    if (!id.empty()) {
      if (absl::Status s = AddShard(r, id, column + static_cast<int>(pos)); !s.ok()) return s;
    }
    pos = end + 1;
  }
  return absl::OkStatus();
}

absl::Status TraceBuilder::AddShard(Row& r, absl::string_view text, int column) {
  absl::Status s = ParseShard(text, source_, r.line, column, &trace_.shards_, &trace_.shard_names_);
  r.shard_count = static_cast<uint32_t>(trace_.shards_.size() - r.shard_begin);
  r.name_count = static_cast<uint32_t>(trace_.shard_names_.size() - r.name_begin);
  if (s.ok() && r.name_count > core::kMaxShardNamesPerRecord) {
    return At(source_, r.line, column, core::CheckShardNameCount("shard", r.name_count).message());
  }
  return s;
}

absl::Status TraceBuilder::AddShardName(Row& r, absl::string_view name, int column) {
  if (absl::Status s = core::CheckShardName("shard", name); !s.ok()) {
    return At(source_, r.line, column, s.message());
  }
  trace_.shard_names_.emplace_back(name);
  r.name_count = static_cast<uint32_t>(trace_.shard_names_.size() - r.name_begin);
  if (r.name_count > core::kMaxShardNamesPerRecord) {
    return At(source_, r.line, column, core::CheckShardNameCount("shard", r.name_count).message());
  }
  return absl::OkStatus();
}

TraceBuilder::Row& TraceBuilder::NewRow(int line) {
  trace_.rows_.emplace_back();
  Trace::Row& r = trace_.rows_.back();
  r.step = 0;
  r.values.fill(0.0);
  r.present = 0;
  r.shard_begin = static_cast<uint32_t>(trace_.shards_.size());
  r.shard_count = 0;
  r.name_begin = static_cast<uint32_t>(trace_.shard_names_.size());
  r.name_count = 0;
  r.checkpoint = -1;
  r.line = line;
  r.loss_scale = 0.0;
  r.loss_scale_set = false;
  r.loss_scale_overflow = false;
  return r;
}

absl::Status TraceBuilder::SetStep(Row& r, int64_t step, int column) {
  if (step < 0) return At(source_, r.line, column, "step must be >= 0");
  // A step before the last one is a restart from a checkpoint logging into
  // the same file: Replay() opens a new attempt there. The same step again
  // is more of that step, merged once the rows are complete.
  r.step = step;
  have_last_ = true;
  last_step_ = step;
  return absl::OkStatus();
}

void TraceBuilder::SetValue(Row& r, Signal s, double v) {
  r.values[static_cast<int>(s)] = v;
  r.present |= core::Bit(s);
  // A nan or inf the log wrote is a report, as it is from the agent: a
  // metric whose every value is NaN is a failure, not an unknown.
  trace_.reported_ |= core::Bit(s);
}

void TraceBuilder::AddShard(Row& r, uint64_t id) {
  trace_.shards_.push_back(id);
  r.shard_count = static_cast<uint32_t>(trace_.shards_.size() - r.shard_begin);
}

void TraceBuilder::SetCheckpoint(Row& r, absl::string_view uri) {
  if (uri.empty()) return;
  r.checkpoint = static_cast<int32_t>(trace_.checkpoints_.size());
  trace_.checkpoints_.emplace_back(uri);
}

void TraceBuilder::SetLossScale(Row& r, double scale, bool overflow) {
  r.loss_scale = scale;
  r.loss_scale_set = true;
  r.loss_scale_overflow = overflow;
}

absl::Status TraceBuilder::AddRecord(const core::StepRecord& rec, int line, Row** out) {
  Row& r = NewRow(line);
  *out = &r;
  if (absl::Status s = SetStep(r, rec.step, 1); !s.ok()) return s;
  for (int i = 0; i < core::kNumSignals; ++i) {
    const Signal sig = static_cast<Signal>(i);
    if (rec.Has(sig)) SetValue(r, sig, rec.Get(sig));
  }
  for (uint64_t id : rec.shards) AddShard(r, id);
  for (const std::string& name : rec.shard_names) {
    trace_.shard_names_.push_back(name);
    r.name_count = static_cast<uint32_t>(trace_.shard_names_.size() - r.name_begin);
  }
  SetCheckpoint(r, rec.checkpoint_uri);
  if (rec.HasLossScale()) SetLossScale(r, rec.loss_scale(), rec.loss_scale_overflow());
  return absl::OkStatus();
}

namespace {

// Whether two rows give the same value (a NaN the same as a NaN) to every
// signal both hold.
bool AgreeOnShared(const TraceBuilder::Row& a, const TraceBuilder::Row& b) {
  const uint32_t both = a.present & b.present;
  for (int s = 0; s < core::kNumSignals; ++s) {
    if (!(both & (1u << s))) continue;
    const double x = a.values[s], y = b.values[s];
    if (x != y && !(std::isnan(x) && std::isnan(y))) return false;
  }
  return true;
}

}  // namespace

void TraceBuilder::MergeSameStep() {
  auto& rows = trace_.rows_;
  if (rows.size() < 2) return;
  // Rows are merged only into the one before, whose shards and names end
  // where the next row's begin (a reader adds them to its newest row).
  auto mergeable = [&](const Row& a, const Row& b) {
    if (a.step != b.step || !AgreeOnShared(a, b)) return false;
    if (a.checkpoint >= 0 && b.checkpoint >= 0 &&
        trace_.checkpoints_[a.checkpoint] != trace_.checkpoints_[b.checkpoint]) {
      return false;
    }
    if (a.loss_scale_set && b.loss_scale_set &&
        (a.loss_scale != b.loss_scale || a.loss_scale_overflow != b.loss_scale_overflow)) {
      return false;
    }
    return (b.shard_count == 0 || a.shard_begin + a.shard_count == b.shard_begin) &&
           (b.name_count == 0 || a.name_begin + a.name_count == b.name_begin);
  };
  size_t w = 0;
  for (size_t i = 1; i < rows.size(); ++i) {
    Row& a = rows[w];
    const Row& b = rows[i];
    if (!mergeable(a, b)) {
      if (++w != i) rows[w] = b;
      continue;
    }
    for (int s = 0; s < core::kNumSignals; ++s) {
      if (b.present & (1u << s)) a.values[s] = b.values[s];
    }
    a.present |= b.present;
    if (a.shard_count == 0) a.shard_begin = b.shard_begin;
    a.shard_count += b.shard_count;
    if (a.name_count == 0) a.name_begin = b.name_begin;
    a.name_count += b.name_count;
    if (a.checkpoint < 0) a.checkpoint = b.checkpoint;
    if (!a.loss_scale_set && b.loss_scale_set) {
      a.loss_scale = b.loss_scale;
      a.loss_scale_set = true;
      a.loss_scale_overflow = b.loss_scale_overflow;
    }
  }
  rows.resize(w + 1);
}

bool TraceBuilder::LateForDrained(const Row& r) {
  if (!have_drained_row_ || r.step != drained_row_.step || !AgreeOnShared(r, drained_row_)) {
    return false;
  }
  std::vector<std::string> added;
  for (int s = 0; s < core::kNumSignals; ++s) {
    if (r.present & ~drained_row_.present & (1u << s)) {
      added.emplace_back(core::SignalName(static_cast<Signal>(s)));
    }
  }
  if (r.shard_count + r.name_count > 0) added.emplace_back("shards");
  if (r.checkpoint >= 0) added.emplace_back("checkpoint");
  if (!added.empty()) {
    AddWarning(absl::StrFormat(
        "%s:%d: more of step %d, written after that step's record was sent (the log was quiet "
        "between them): its %s not sent",
        source_, r.line, r.step, absl::StrJoin(added, ", ")));
  }
  return true;
}

void TraceBuilder::KeepFrom(size_t from) {
  auto& rows = trace_.rows_;
  if (from >= rows.size()) {
    rows.clear();
    trace_.shards_.clear();
    trace_.shard_names_.clear();
    trace_.checkpoints_.clear();
    held_ = 0;
    return;
  }
  Row kept = rows[from];
  Trace::ShardIds shards(trace_.shards_.begin() + kept.shard_begin,
                         trace_.shards_.begin() + kept.shard_begin + kept.shard_count);
  std::vector<std::string> names(
      std::make_move_iterator(trace_.shard_names_.begin() + kept.name_begin),
      std::make_move_iterator(trace_.shard_names_.begin() + kept.name_begin + kept.name_count));
  std::string checkpoint = kept.checkpoint >= 0 ? std::move(trace_.checkpoints_[kept.checkpoint])
                                                : std::string();
  rows.clear();
  trace_.shards_ = std::move(shards);
  trace_.shard_names_ = std::move(names);
  trace_.checkpoints_.clear();
  kept.shard_begin = 0;
  kept.name_begin = 0;
  if (kept.checkpoint >= 0) {
    kept.checkpoint = 0;
    trace_.checkpoints_.push_back(std::move(checkpoint));
  }
  rows.push_back(kept);
  held_ = 1;
}

void TraceBuilder::Truncate(size_t n) {
  auto& rows = trace_.rows_;
  if (rows.size() > n) rows.resize(n);
  size_t shards = 0, names = 0, checkpoints = 0;
  for (const Row& r : rows) {
    shards = std::max<size_t>(shards, r.shard_begin + r.shard_count);
    names = std::max<size_t>(names, r.name_begin + r.name_count);
    if (r.checkpoint >= 0) checkpoints = std::max<size_t>(checkpoints, r.checkpoint + 1);
  }
  trace_.shards_.resize(shards);
  trace_.shard_names_.resize(names);
  trace_.checkpoints_.resize(checkpoints);
}

absl::StatusOr<Trace> TraceBuilder::Finish(MetricsFormat format) {
  trace_.format_ = format;
  MergeSameStep();
  if (trace_.rows_.empty()) {
    return At(source_, 1, 1, "no records: the file holds no step");
  }
  return std::move(trace_);
}

}  // namespace trainwatch::logs
