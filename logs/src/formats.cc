#include "formats.h"

#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "trainwatch/logs/line_pattern.h"
#include "trainwatch/logs/lines.h"

namespace trainwatch::logs {

namespace {

// A JSON object on the log's first line (a Python dict's repr, which starts
// "{'", is Hugging Face's, tried before).
bool IsJsonLinesStart(absl::string_view line, bool first) {
  const absl::string_view text = absl::StripAsciiWhitespace(line);
  return first && !text.empty() && text.front() == '{' && !absl::StartsWith(text, "{'");
}

}  // namespace

const std::vector<FormatSpec>& Formats() {
  using Options = const ReadOptions&;
  // Detection order: the Python frameworks' lines first (a Hugging Face dict
  // starts with '{' as a JSON line does), JSON lines on the first line, then
  // the text logs.
  static const auto* const list = new std::vector<FormatSpec>{
      {MetricsFormat::kHfTrainer, "hf", "Hugging Face Trainer",
       [](absl::string_view s, Options o) { return NewHfTrainerParser(s, o.logging_steps); },
       true, [](absl::string_view l, bool) { return IsHfTrainerLine(l); }},
      {MetricsFormat::kNemo, "nemo", "NeMo",
       [](absl::string_view s, Options) { return NewNemoParser(s); }, true,
       [](absl::string_view l, bool) { return IsNemoLine(l); }},
      // Composer's records are whole only at the line after their block, too
      // late for DeepSpeed's layer to place an overflow by them.
      {MetricsFormat::kComposer, "composer", "Composer",
       [](absl::string_view s, Options) { return NewComposerParser(s); }, false,
       [](absl::string_view l, bool) { return IsComposerLine(l); }},
      {MetricsFormat::kTorchTitan, "torchtitan", "torchtitan",
       [](absl::string_view s, Options) { return NewTorchTitanParser(s); }, true,
       [](absl::string_view l, bool) { return IsTorchTitanLine(l); }},
      // Exports (JSON lines, CSV, trainer_state.json) carry no DeepSpeed lines.
      {MetricsFormat::kJsonLines, "jsonl", "JSON lines",
       [](absl::string_view s, Options) { return NewJsonLinesParser(s); }, false,
       IsJsonLinesStart},
      {MetricsFormat::kLlmc, "llmc", "llm.c",
       [](absl::string_view s, Options) { return NewLlmcParser(s); }, true,
       [](absl::string_view l, bool) { return IsLlmcLine(l); }},
      {MetricsFormat::kStepLog, "steplog", "step:S/N",
       [](absl::string_view s, Options) { return NewStepLogParser(s); }, true,
       [](absl::string_view l, bool) { return IsStepLogLine(l); }},
      {MetricsFormat::kMegatron, "megatron", "Megatron-LM",
       [](absl::string_view s, Options) { return NewMegatronParser(s); }, true,
       [](absl::string_view l, bool) { return IsMegatronLine(l); }},
      {MetricsFormat::kNanoGpt, "nanogpt", "nanoGPT",
       [](absl::string_view s, Options) { return NewNanoGptParser(s); }, true,
       [](absl::string_view l, bool) { return IsNanoGptLine(l); }},
      // Detected apart: its lines with no trainer's line among them.
      {MetricsFormat::kDeepSpeed, "deepspeed", "DeepSpeed",
       [](absl::string_view s, Options) { return NewDeepSpeedLayer(s, nullptr); }, false,
       nullptr},
      // Detected with JSON lines: one document on many lines.
      {MetricsFormat::kHfTrainerState, "hf-state", nullptr,
       [](absl::string_view s, Options) { return NewHfTrainerStateParser(s); }, false, nullptr},
      {MetricsFormat::kCsv, "csv", nullptr,
       [](absl::string_view s, Options o) { return NewCsvParser(s, true, o.column_map); }, false,
       nullptr},
      // Detected by its header, the first line (DetectFormat).
      {MetricsFormat::kGenericCsv, "wandb-csv", "a CSV whose header names a step column",
       [](absl::string_view s, Options o) { return NewCsvParser(s, false, o.column_map); },
       false, nullptr},
      {MetricsFormat::kTensorBoard, "tensorboard", nullptr, nullptr, false, nullptr},
      // The user's own, given by --pattern (never detected, nor a --format).
      {MetricsFormat::kPattern, "pattern", nullptr,
       [](absl::string_view s, Options o) -> std::unique_ptr<LineParser> {
         return o.pattern == nullptr ? nullptr : NewPatternParser(o.pattern, s);
       },
       true, nullptr},
      {MetricsFormat::kAuto, "auto", nullptr, nullptr, false, nullptr},
  };
  return *list;
}

const FormatSpec* FindFormat(MetricsFormat id) {
  for (const FormatSpec& f : Formats()) {
    if (f.id == id) return &f;
  }
  return nullptr;
}

absl::string_view FormatName(MetricsFormat f) {
  const FormatSpec* spec = FindFormat(f);
  return spec == nullptr ? "unknown" : spec->name;
}

bool ParseFormatName(absl::string_view name, MetricsFormat* out) {
  for (const FormatSpec& f : Formats()) {
    if (f.id != MetricsFormat::kPattern && f.name == name) {  // --pattern gives that one
      *out = f.id;
      return true;
    }
  }
  // lightning: its CSVLogger's metrics.csv is an export like any other.
  if (name == "json" || name == "tensorboard-csv" || name == "generic-csv" ||
      name == "lightning") {
    *out = name == "json" ? MetricsFormat::kJsonLines : MetricsFormat::kGenericCsv;
    return true;
  }
  return false;
}

std::unique_ptr<LineParser> NewLineParser(MetricsFormat format, absl::string_view source,
                                          const ReadOptions& options) {
  const FormatSpec* spec = FindFormat(format);
  if (spec == nullptr || spec->reader == nullptr) return nullptr;
  std::unique_ptr<LineParser> reader = spec->reader(source, options);
  if (reader == nullptr || !spec->deepspeed_lines) return reader;
  return NewDeepSpeedLayer(source, std::move(reader));
}

MetricsFormat DetectFormat(absl::string_view content) {
  int seen = 0;
  bool deepspeed = false, csv_header = false;
  LineReader lines(content);
  absl::string_view raw;
  while (seen < 500 && lines.Next(&raw)) {
    const absl::string_view line = absl::StripAsciiWhitespace(raw);
    if (line.empty() || line.front() == '#') continue;  // a comment says nothing of the format
    // A CSV's first line is its header: a step column among its names, or
    // names alone (the CSV reader then says which column it lacks), not a
    // printed config ("lr=3e-4, steps=400"), prose ("Resolving data files,
    // this may take a while") or numbers.
    if (++seen == 1 && absl::StrContains(line, ',')) {
      bool step = false, names = true;
      for (absl::string_view name : absl::StrSplit(line, ',')) {
        name = absl::StripAsciiWhitespace(name);
        if (name.size() >= 2 && name.front() == '"' && name.back() == '"') {
          name = name.substr(1, name.size() - 2);
        }
        step |= IsStepColumn(absl::AsciiStrToLower(name));
        names &= !name.empty() && !absl::ascii_isdigit(static_cast<unsigned char>(name[0])) &&
                 name[0] != '-' && name[0] != '.' && !absl::StrContains(name, '=') &&
                 !absl::StrContains(name, ' ');
      }
      csv_header = step || names;
    }
    for (const FormatSpec& f : Formats()) {
      if (f.detects == nullptr || !f.detects(raw, seen == 1)) continue;
      // A document on many lines, not JSON lines: trainer_state.json.
      if (f.id == MetricsFormat::kJsonLines && line == "{" && LooksLikeHfTrainerState(content)) {
        return MetricsFormat::kHfTrainerState;
      }
      return f.id;
    }
    deepspeed = deepspeed || IsDeepSpeedLine(line);
  }
  // DeepSpeed's lines with no trainer's line among the first 500: they are
  // the log. Else none of the logs: a CSV with a header, or nothing known.
  if (deepspeed) return MetricsFormat::kDeepSpeed;
  return csv_header ? MetricsFormat::kCsv : MetricsFormat::kAuto;
}

absl::Status UnknownFormatError(absl::string_view source, absl::string_view content) {
  // The first line that names a loss (the one to describe), else the first.
  LineReader lines(content);
  absl::string_view raw, first, with_loss;
  for (int seen = 0; with_loss.empty() && seen < 500 && lines.Next(&raw);) {
    const absl::string_view line = absl::StripAsciiWhitespace(raw);
    if (line.empty() || line.front() == '#') continue;
    ++seen;
    if (first.empty()) first = line;
    if (absl::StrContains(absl::AsciiStrToLower(line), "loss")) with_loss = line;
  }
  if (!with_loss.empty()) first = with_loss;
  constexpr size_t kShown = 100;
  std::string shown(first.substr(0, kShown));
  if (first.size() > kShown) shown += "...";
  std::vector<std::string> tried;
  for (const FormatSpec& f : Formats()) {
    if (f.tried != nullptr) tried.emplace_back(f.tried);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      source, ": no known format in its first lines (tried: ", absl::StrJoin(tried, ", "),
      "); a line: \"", shown,
      "\". Describe the lines with --pattern, a template such as 'step {step}/{} | loss {loss} "
      "| gnorm {grad_norm}' ({NAME} a number, {} any text) or a regex with named groups "
      "(?<step>...) (?<loss>...); or name the --format"));
}

}  // namespace trainwatch::logs
