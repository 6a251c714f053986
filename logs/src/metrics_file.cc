#include "trainwatch/logs/metrics_file.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "trainwatch/logs/tensorboard.h"
#include "trainwatch/core/json.h"
#include "trainwatch/logs/line_pattern.h"
#include "trainwatch/logs/lines.h"
#include "trainwatch/logs/trace_builder.h"

namespace trainwatch::logs {

using core::Signal;

core::StepRecord Trace::Record(size_t i) const {
  const Row& r = rows_[i];
  core::StepRecord rec;
  rec.step = r.step;
  for (int s = 0; s < core::kNumSignals; ++s) {
    if (r.present & (1u << s)) rec.Set(static_cast<Signal>(s), r.values[s]);
  }
  rec.shards = absl::MakeConstSpan(shards_.data() + r.shard_begin, r.shard_count);
  rec.shard_names = absl::MakeConstSpan(shard_names_.data() + r.name_begin, r.name_count);
  if (r.checkpoint >= 0) rec.checkpoint_uri = checkpoints_[static_cast<size_t>(r.checkpoint)];
  if (r.loss_scale_set) rec.SetLossScale(r.loss_scale, r.loss_scale_overflow);
  return rec;
}

bool IsStepColumn(absl::string_view lower) {
  for (absl::string_view n : {"step", "_step", "global_step", "iteration", "iter",
                              "trainer/global_step", "train/step"}) {
    if (lower == n) return true;
  }
  return false;
}

namespace {

constexpr Signal kRequired[] = {Signal::kLoss, Signal::kGradNorm, Signal::kLogZ,
                                Signal::kNanFrac};

// A field of the line being parsed: a view into the line, or for a quoted
// field with doubled quotes into the parser's scratch (valid until the next
// line), so that a row costs no allocation.
struct CsvField {
  absl::string_view text;
  int column;
};

bool IsCsvSpace(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v'; }

// absl::StripAsciiWhitespace, with the common case (nothing to strip) first.
absl::string_view StripField(absl::string_view f) {
  while (!f.empty() && IsCsvSpace(f.front())) f.remove_prefix(1);
  while (!f.empty() && IsCsvSpace(f.back())) f.remove_suffix(1);
  return f;
}

// Splits one CSV line (RFC 4180 quoting, no embedded newlines). `scratch`
// holds unescaped quoted fields; it is reserved to the line's size first, so
// it never moves while fields point into it.
absl::Status SplitCsv(absl::string_view line, absl::string_view source, int line_no,
                      std::vector<CsvField>* out, std::string* scratch) {
  out->clear();
  scratch->clear();
  scratch->reserve(line.size());
  size_t i = 0;
  for (;;) {
    CsvField f;
    f.column = static_cast<int>(i) + 1;
    if (i < line.size() && line[i] == '"') {
      ++i;
      const size_t begin = scratch->size();
      for (;;) {
        if (i >= line.size()) return At(source, line_no, f.column, "unterminated quoted field");
        if (line[i] == '"') {
          if (i + 1 < line.size() && line[i + 1] == '"') {
            scratch->push_back('"');
            i += 2;
            continue;
          }
          ++i;
          break;
        }
        scratch->push_back(line[i++]);
      }
      f.text = absl::string_view(*scratch).substr(begin);
      if (i < line.size() && line[i] != ',') {
        return At(source, line_no, static_cast<int>(i) + 1,
                  "unexpected text after a quoted field");
      }
    } else {
      // A loop, not find(): fields are a few characters, shorter than the
      // call it would cost.
      size_t end = i;
      while (end < line.size() && line[end] != ',') ++end;
      f.text = StripField(line.substr(i, end - i));
      i = end;
    }
    out->push_back(f);
    if (i >= line.size()) return absl::OkStatus();
    ++i;  // the comma
  }
}

// strict: trainwatch's own CSV (the five columns required, names exact).
// Otherwise a generic export: a step column, metric columns by --map or by
// their usual names, absent metrics unknown, rows without any metric read
// past (exports interleave metrics logged at different steps).
class CsvParser : public LineParser {
 public:
  CsvParser(absl::string_view source, bool strict, const ColumnMap& map)
      : source_(source), strict_(strict), map_(map) {}

  absl::Status Line(absl::string_view line, int line_no, TraceBuilder& b) override {
    if (StripField(line).empty()) return absl::OkStatus();
    if (absl::Status s = SplitCsv(line, source_, line_no, &fields_, &scratch_); !s.ok()) {
      return s;
    }
    if (!have_header_) {
      have_header_ = true;
      bool seen_step = false;
      uint32_t seen = 0;
      std::vector<bool> map_used(map_.size(), false);
      for (const CsvField& f : fields_) {
        const std::string name = absl::AsciiStrToLower(f.text);
        Column c{Col::kIgnored, Signal::kLoss};
        Signal s;
        bool is_signal = false;
        for (size_t m = 0; m < map_.size(); ++m) {
          if (absl::AsciiStrToLower(map_[m].second) == name) {
            s = map_[m].first;
            is_signal = true;
            map_used[m] = true;
          }
        }
        if (!is_signal) {
          bool mapped_elsewhere = false;
          is_signal = strict_ ? SignalByName(name, &s) : SignalByAlias(name, &s);
          for (const auto& [sig, src] : map_) mapped_elsewhere |= is_signal && sig == s;
          if (mapped_elsewhere) is_signal = false;  // --map chose another column
        }
        if (strict_ ? name == "step" : IsStepColumn(name)) {
          if (seen_step) return At(source_, line_no, f.column, "a second step column");
          c.kind = Col::kStep;
          seen_step = true;
        } else if (name == "shard" || name == "shards") {
          c.kind = Col::kShard;
        } else if (name == "checkpoint") {
          c.kind = Col::kCheckpoint;
        } else if (is_signal) {
          if (seen & core::Bit(s)) {
            return At(source_, line_no, f.column,
                      absl::StrCat("column \"", f.text, "\" is a second ", core::SignalName(s),
                                   " column"));
          }
          seen |= core::Bit(s);
          c = Column{Col::kSignal, s};
        }
        // Anything else (loss_ema_ratio, which the engine derives; a
        // trainer's extra columns) is read past.
        columns_.push_back(c);
      }
      for (size_t m = 0; m < map_.size(); ++m) {
        if (!map_used[m]) {
          return At(source_, line_no, 1,
                    absl::StrCat("--map names column \"", map_[m].second,
                                 "\", which the header does not have"));
        }
      }
      if (strict_) {
        std::vector<std::string> missing;
        if (!seen_step) missing.push_back("step");
        for (Signal s : kRequired) {
          if (!(seen & core::Bit(s))) missing.emplace_back(core::SignalName(s));
        }
        if (!missing.empty()) {
          return At(source_, line_no, 1,
                    absl::StrCat("header lacks the column", missing.size() > 1 ? "s " : " ",
                                 absl::StrJoin(missing, ", "),
                                 " (expected step, loss, grad_norm, log_z, nan_frac)"));
        }
      } else if (!seen_step) {
        return At(source_, line_no, 1,
                  "no step column in the header (step, _step, global_step or iteration)");
      } else if (!(seen & core::Bit(Signal::kLoss))) {
        std::vector<std::string> names;
        for (const CsvField& f : fields_) names.emplace_back(f.text);
        return At(source_, line_no, 1,
                  absl::StrCat("no loss column in the header (its columns: ",
                               absl::StrJoin(names, ", "),
                               "); name it with --map, e.g. --map loss=train/loss (the names "
                               "read without it: docs/log-formats.md)"));
      }
      return absl::OkStatus();
    }
    if (fields_.size() != columns_.size()) {
      return At(source_, line_no, 1,
                absl::StrFormat("%d fields, but the header names %d columns", fields_.size(),
                                columns_.size()));
    }
    if (!strict_) {
      bool any = false;
      for (size_t i = 0; i < fields_.size(); ++i) {
        any |= columns_[i].kind == Col::kSignal && !fields_[i].text.empty();
      }
      if (!any) return absl::OkStatus();
    }
    auto& row = b.NewRow(line_no);
    for (size_t i = 0; i < fields_.size(); ++i) {
      const CsvField& f = fields_[i];
      switch (columns_[i].kind) {
        case Col::kStep: {
          int64_t step;
          double d;
          // Exports sometimes write steps as 100.0.
          const bool ok = ParseInt64(f.text, &step) ||
                          (!strict_ && ParseDouble(f.text, &d) && d == std::floor(d) &&
                           d >= 0 && d < 9.0e15 && ((step = static_cast<int64_t>(d)), true));
          if (!ok) {
            return At(source_, line_no, f.column,
                      absl::StrCat("step \"", f.text, "\" is not an integer"));
          }
          if (absl::Status s = b.SetStep(row, step, f.column); !s.ok()) return s;
          break;
        }
        case Col::kSignal: {
          if (f.text.empty()) break;  // unknown at this step
          double v;
          if (!ParseDouble(f.text, &v)) {
            return At(source_, line_no, f.column,
                      absl::StrCat(core::SignalName(columns_[i].signal), " \"", f.text,
                                   "\" is not a number"));
          }
          b.SetValue(row, columns_[i].signal, v);
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
    return absl::OkStatus();
  }

  absl::Status End(const TraceBuilder&) override {
    if (have_header_) return absl::OkStatus();
    return At(source_, 1, 1,
              "empty file: expected a header naming step, loss, grad_norm, log_z, nan_frac");
  }

 private:
  enum class Col { kStep, kSignal, kShard, kCheckpoint, kIgnored };
  struct Column {
    Col kind;
    Signal signal;
  };
  absl::string_view source_;
  const bool strict_;
  const ColumnMap map_;
  std::vector<Column> columns_;
  std::vector<CsvField> fields_;
  std::string scratch_;  // unescaped quoted fields of the current line
  bool have_header_ = false;
};

}  // namespace

std::unique_ptr<LineParser> NewCsvParser(absl::string_view source, bool strict,
                                         const ColumnMap& map) {
  return std::make_unique<CsvParser>(source, strict, map);
}

namespace {

// The names trainers and loggers give each signal, lower case: the one table
// every keyed format reads (JSON lines, CSV and W&B exports, TensorBoard
// tags, Hugging Face dicts' other keys, --pattern fields). docs/log-formats.md
// lists it (a test compares the two).
struct Alias {
  Signal signal;
  std::vector<std::string> names;
};
const std::vector<Alias>& Aliases() {
  static const auto* const table = new std::vector<Alias>{
      // train_loss_step, loss_step: Lightning's names for a loss logged
      // on_step (and on_epoch: its _epoch twin, an average, is read past, as
      // is the Hugging Face summary's train_loss, which is not keyed by a
      // step). lm loss: Megatron; reduced_train_loss: NeMo;
      // loss_metrics/global_avg_loss: torchtitan; loss/train/total:
      // Composer; train/ce loss: OLMo-core; train/samples/train_loss:
      // DeepSpeed's monitor.
      {Signal::kLoss,
       {"loss", "train/loss", "train_loss", "training_loss", "training/loss", "loss/train",
        "loss/training", "train/loss_step", "train_loss_step", "loss_step", "lm loss", "lm_loss",
        "train/lm_loss", "reduced_train_loss", "loss_metrics/global_avg_loss", "loss/train/total",
        "train/ce loss", "train/samples/train_loss"}},
      // grad_2.0_norm_total: Lightning's grad_norm(module, norm_type=2)
      // utility's total; optim/total grad norm: OLMo-core.
      {Signal::kGradNorm,
       {"grad_norm", "train/grad_norm", "grad-norm", "grad norm", "gradient_norm",
        "train/gradient_norm", "global_grad_norm", "train/global_grad_norm", "grad_norm/train",
        "optim/grad_norm", "optim/total grad norm", "grad_2.0_norm_total"}},
      {Signal::kLogZ, {"log_z", "train/log_z", "logz", "train/logz"}},
      {Signal::kNanFrac, {"nan_frac", "train/nan_frac"}},
      // lr-adamw: Lightning's LearningRateMonitor, named after the optimizer.
      {Signal::kLearningRate,
       {"lr", "learning_rate", "learning-rate", "learning rate", "train/lr",
        "train/learning_rate", "lr/train", "learning_rate/train", "optim/lr", "train/samples/lr",
        "lr-adam", "lr-adamw", "lr-sgd"}},
      {Signal::kZLossAlpha, {"z_loss_alpha"}},
      {Signal::kActivationMax, {"activation_max"}},
      {Signal::kAttentionLogitP99, {"attention_logit_p99"}},
  };
  return *table;
}

}  // namespace

bool SignalByAlias(absl::string_view lower, Signal* out) {
  for (const Alias& a : Aliases()) {
    for (const std::string& n : a.names) {
      if (lower == n) {
        *out = a.signal;
        return true;
      }
    }
  }
  return false;
}

std::vector<std::string> AliasesOf(Signal s) {
  for (const Alias& a : Aliases()) {
    if (a.signal == s) return a.names;
  }
  return {};
}

absl::StatusOr<ColumnMap> ParseColumnMap(absl::string_view spec) {
  ColumnMap map;
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    const size_t eq = item.find('=');
    Signal s;
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--map entry \"", item, "\" is not SIGNAL=COLUMN"));
    }
    const absl::string_view target = absl::StripAsciiWhitespace(item.substr(0, eq));
    const absl::string_view column = absl::StripAsciiWhitespace(item.substr(eq + 1));
    if (!SignalByName(target, &s)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--map: unknown signal \"", target,
          "\" (one of loss, grad_norm, log_z, nan_frac, lr, z_loss_alpha, activation_max, "
          "attention_logit_p99)"));
    }
    if (column.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--map: no column for ", target));
    }
    for (const auto& [sig, col] : map) {
      if (sig == s) return absl::InvalidArgumentError(absl::StrCat("--map: ", target, " twice"));
    }
    map.emplace_back(s, std::string(column));
  }
  return map;
}

absl::StatusOr<Trace> ParseMetrics(absl::string_view content, absl::string_view source,
                                   const ReadOptions& options) {
  MetricsFormat format = options.format;
  if (format == MetricsFormat::kAuto && LooksLikeEventFile(content)) {
    format = MetricsFormat::kTensorBoard;
  }
  if (format == MetricsFormat::kAuto) {
    if (absl::StripLeadingAsciiWhitespace(content).empty()) {
      return At(source, 1, 1,
                "empty file: expected a CSV header, JSON lines, or a trainer's log (llm.c, "
                "step:S/N, Megatron-LM, nanoGPT, DeepSpeed, Hugging Face, torchtitan, Composer, "
                "NeMo)");
    }
    format = DetectFormat(content);
    if (format == MetricsFormat::kAuto) return UnknownFormatError(source, content);
    // Detected CSV is read leniently: our five columns are found by name like
    // any export's, and an absent one is unknown. --format csv is strict.
    if (format == MetricsFormat::kCsv) format = MetricsFormat::kGenericCsv;
  }
  if (format == MetricsFormat::kTensorBoard) {
    return ParseEventFiles({EventFileData{std::string(source), content}}, options.column_map);
  }
  return ParseLines(content, source, format, options);
}

absl::StatusOr<Trace> ParseLines(absl::string_view content, absl::string_view source,
                                 MetricsFormat format, const ReadOptions& options) {
  std::unique_ptr<LineParser> parser = NewLineParser(format, source, options);
  if (parser == nullptr) return absl::InternalError("not a line format");
  TraceBuilder b(source);
  if (format == MetricsFormat::kCsv || format == MetricsFormat::kGenericCsv ||
      format == MetricsFormat::kJsonLines) {
    // At most a row per line in these, so one allocation for the whole trace
    // (a detected CSV is read as kGenericCsv, so it is the common case).
    b.Reserve(CountNewlines(content) + 1);
  }
  LineReader lines(content);
  absl::string_view line;
  while (lines.Next(&line)) {
    if (absl::Status s = parser->Line(line, lines.line_no(), b); !s.ok()) return s;
  }
  if (absl::Status s = parser->Flush(b); !s.ok()) return s;
  if (absl::Status s = parser->End(b); !s.ok()) return s;
  return b.Finish(format);
}

absl::StatusOr<Trace> ReadMetricsFile(const std::string& folder_or_file,
                                      const ReadOptions& options) {
  std::error_code ec;
  std::string path = folder_or_file;
  bool folder = std::filesystem::is_directory(path, ec);
  if (folder && options.format == MetricsFormat::kHfTrainerState) {
    // A Trainer's output folder: its newest trainer_state.json.
    path = NewestFileNamed(path, "trainer_state.json");
    folder = false;
  }
  if (folder || (options.format == MetricsFormat::kAuto &&
                 IsEventFileName(std::filesystem::path(path).filename().string()))) {
    if (options.format != MetricsFormat::kAuto && options.format != MetricsFormat::kTensorBoard) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": a folder is read as TensorBoard event files, not as ",
          FormatName(options.format)));
    }
    return ReadEventFiles(path, options.column_map);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  LargeString content;
  const uintmax_t size = std::filesystem::file_size(path, ec);  // -1 and ec for a pipe
  if (!ReadStream(in, ec ? 0 : static_cast<size_t>(size), &content)) {
    return absl::DataLossError(absl::StrCat(path, ": read error"));
  }
  return ParseMetrics(absl::string_view(content.data(), content.size()), path, options);
}

}  // namespace trainwatch::logs
