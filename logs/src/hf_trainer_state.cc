// Hugging Face's trainer_state.json: the Trainer's state, rewritten whole at
// every save (json.dumps(..., indent=2, sort_keys=True)). Its log_history
// holds one object per on_log: train logs {"epoch", "grad_norm",
// "learning_rate", "loss", "step"}, eval logs {"eval_loss", ..., "step"}
// and the final summary {"train_loss", "train_runtime", ..., "step"}; only
// the train logs (those with "loss") are records. Python writes a nan loss
// as NaN, which core::ParseJson reads.
//
// The reader is fed lines, as every text reader is, and reads a document
// when its closing brace comes. A follower feeds it the file again after
// each rewrite (the same parser across the rewrites): entries at steps it
// already gave are read past, so each step is sent once.

#include <cmath>
#include <filesystem>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "trainwatch/logs/trace_builder.h"
#include "trainwatch/core/json.h"

namespace trainwatch::logs {
namespace {

using core::JsonValue;
using core::Signal;

class HfTrainerStateParser : public LineParser {
 public:
  explicit HfTrainerStateParser(absl::string_view source) : source_(source) {}

  absl::Status Line(absl::string_view line, int n, TraceBuilder& b) override {
    if (buffer_.empty()) {
      if (absl::StripAsciiWhitespace(line).empty()) return absl::OkStatus();
      first_line_ = n;
    }
    absl::StrAppend(&buffer_, line, "\n");
    // Braces outside strings: the document is whole when they balance.
    for (char c : line) {
      if (in_string_) {
        if (escaped_) {
          escaped_ = false;
        } else if (c == '\\') {
          escaped_ = true;
        } else if (c == '"') {
          in_string_ = false;
        }
      } else if (c == '"') {
        in_string_ = true;
      } else if (c == '{' || c == '[') {
        ++depth_;
      } else if (c == '}' || c == ']') {
        --depth_;
      }
    }
    if (depth_ > 0 && !in_string_) return absl::OkStatus();
    if (in_string_) return absl::OkStatus();
    return Document(b);
  }

  // An incomplete document at the end (a file cut short, or read while it
  // was being written): the JSON reader says where it ends.
  absl::Status Flush(TraceBuilder& b) override {
    if (buffer_.empty()) return absl::OkStatus();
    return Document(b);
  }

  absl::Status End(const TraceBuilder& b) override {
    if (b.rows() > 0) return absl::OkStatus();
    return At(source_, 1, 1,
              documents_ == 0
                  ? "no trainer_state.json document: nothing to replay"
                  : "trainer_state.json's log_history has no entry with a \"loss\": nothing to "
                    "replay");
  }

 private:
  absl::Status Document(TraceBuilder& b) {
    const std::string text = std::move(buffer_);
    buffer_.clear();
    depth_ = 0;
    in_string_ = escaped_ = false;
    absl::StatusOr<JsonValue> doc = core::ParseJson(text, source_, first_line_);
    if (!doc.ok()) return doc.status();
    ++documents_;
    if (doc->type != JsonValue::Type::kObject) {
      return At(source_, doc->line, doc->column, "trainer_state.json must be a JSON object");
    }
    const JsonValue* history = doc->Find("log_history");
    if (history == nullptr) {
      return At(source_, doc->line, doc->column, "trainer_state.json has no \"log_history\"");
    }
    if (history->type != JsonValue::Type::kArray) {
      return At(source_, history->line, history->column, "\"log_history\" must be a list");
    }
    for (const JsonValue& e : history->array) {
      if (e.type != JsonValue::Type::kObject) {
        return At(source_, e.line, e.column, "a log_history entry must be an object");
      }
      const JsonValue* loss = e.Find("loss");
      if (loss == nullptr) continue;  // eval, or the summary
      const JsonValue* step = e.Find("step");
      if (step == nullptr) return At(source_, e.line, e.column, "entry without a \"step\"");
      if (step->type != JsonValue::Type::kNumber || !std::isfinite(step->number) ||
          step->number < 0 || step->number != std::floor(step->number)) {
        return At(source_, step->line, step->column, "step must be a non-negative integer");
      }
      const auto s = static_cast<int64_t>(step->number);
      if (s <= given_) continue;  // given from an earlier version of the file
      auto& row = b.NewRow(e.line);
      if (absl::Status st = b.SetStep(row, s, step->column); !st.ok()) return st;
      for (const auto& [key, sig] : {std::pair<const char*, Signal>{"loss", Signal::kLoss},
                                     {"grad_norm", Signal::kGradNorm},
                                     {"learning_rate", Signal::kLearningRate}}) {
        const JsonValue* v = e.Find(key);
        if (v == nullptr || v->type == JsonValue::Type::kNull) continue;
        double d;
        if (v->type == JsonValue::Type::kNumber) {
          d = v->number;
        } else if (v->type != JsonValue::Type::kString || !ParseDouble(v->string, &d)) {
          return At(source_, v->line, v->column,
                    absl::StrCat(key, " \"", v->type == JsonValue::Type::kString ? v->string : "",
                                 "\" is not a number"));
        }
        b.SetValue(row, sig, d);
      }
      given_ = s;
    }
    return absl::OkStatus();
  }

  absl::string_view source_;
  std::string buffer_;
  int first_line_ = 1;
  int depth_ = 0;
  bool in_string_ = false, escaped_ = false;
  int64_t given_ = -1;  // the highest step given
  int documents_ = 0;
};

}  // namespace

std::unique_ptr<LineParser> NewHfTrainerStateParser(absl::string_view source) {
  return std::make_unique<HfTrainerStateParser>(source);
}

std::string NewestFileNamed(const std::string& folder, const std::string& name) {
  std::error_code ec;
  std::string newest = (std::filesystem::path(folder) / name).string();
  std::filesystem::file_time_type newest_time = std::filesystem::last_write_time(newest, ec);
  if (ec) newest_time = std::filesystem::file_time_type::min();
  for (const auto& entry : std::filesystem::directory_iterator(folder, ec)) {
    std::error_code sub;
    if (!entry.is_directory(sub)) continue;
    const std::filesystem::path candidate = entry.path() / name;
    const auto t = std::filesystem::last_write_time(candidate, sub);
    if (!sub && (t > newest_time || (t == newest_time && candidate.string() > newest))) {
      newest = candidate.string();
      newest_time = t;
    }
  }
  return newest;
}

bool LooksLikeHfTrainerState(absl::string_view content) {
  const absl::string_view head = absl::StripLeadingAsciiWhitespace(content.substr(0, 1 << 16));
  return !head.empty() && head[0] == '{' && absl::StrContains(head, "\"log_history\":");
}

}  // namespace trainwatch::logs
