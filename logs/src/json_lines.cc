// JSON lines (`jsonl`): one object per line, keyed by trainwatch's own names
// or the names loggers write (the same alias table as the CSV exports'),
// shards as ids, lists of ids and names, or a CSV-style string.

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "trainwatch/core/json.h"
#include "trainwatch/logs/trace_builder.h"

namespace trainwatch::logs {

namespace {

using core::Signal;

class JsonLinesParser : public LineParser {
 public:
  explicit JsonLinesParser(absl::string_view source) : source_(source) {}

  absl::Status Line(absl::string_view line, int line_no, TraceBuilder& b) override {
    ++lines_;
    const absl::string_view text = absl::StripAsciiWhitespace(line);
    if (text.empty() || text.front() == '#') return absl::OkStatus();  // a comment is read past
    absl::StatusOr<core::JsonValue> v = core::ParseJson(line, source_, line_no);
    if (!v.ok()) return v.status();
    if (v->type != core::JsonValue::Type::kObject) {
      return At(source_, line_no, v->column, "each line must be a JSON object");
    }
    auto& row = b.NewRow(line_no);
    // The step, and each metric, under its own name or a usual alias (the
    // table every keyed format reads: IsStepColumn, SignalByAlias); the own
    // name wins over an alias, and two aliases of one metric are an error.
    const core::JsonValue* step = v->Find("step");
    std::string step_key = "step";
    for (const auto& [key, val] : v->object) {
      if (step == nullptr && IsStepColumn(absl::AsciiStrToLower(key))) {
        step = &val;
        step_key = key;
      }
    }
    if (step == nullptr) {
      return At(source_, line_no, 1,
                "missing a step key (step, _step, global_step, iteration, iter, "
                "trainer/global_step or train/step)");
    }
    std::array<const std::string*, core::kNumSignals> named{};  // the key each metric came from
    for (const auto& [key, val] : v->object) {
      Signal sig;
      const bool exact = SignalByName(key, &sig);
      if (!exact && !SignalByAlias(absl::AsciiStrToLower(key), &sig)) continue;
      const std::string*& taken = named[static_cast<size_t>(sig)];
      if (taken != nullptr && !exact) {
        if (SignalByName(*taken, &sig)) continue;  // its own name is already there
        return At(source_, line_no, val.column,
                  absl::StrCat("\"", *taken, "\" and \"", key, "\" both name the ",
                               core::SignalName(sig), "; keep one, or name it \"",
                               core::SignalName(sig), "\""));
      }
      taken = &key;
    }
    if (step->type != core::JsonValue::Type::kNumber || !std::isfinite(step->number) ||
        step->number != std::floor(step->number)) {
      return At(source_, line_no, step->column, "step must be an integer");
    }
    if (absl::Status s = b.SetStep(row, static_cast<int64_t>(step->number), step->column);
        !s.ok()) {
      return s;
    }
    for (const auto& [key, val] : v->object) {
      Signal sig;
      if (key == step_key) continue;
      if (keys_.size() < kKeysShown && std::find(keys_.begin(), keys_.end(), key) == keys_.end()) {
        keys_.push_back(key);
      }
      // (A pointer, not the binding: a lambda may not capture a structured
      // binding in C++17.)
      const std::string* const this_key = &key;
      const auto metric = std::find_if(named.begin(), named.end(),
                                       [this_key](const std::string* k) { return k == this_key; });
      if (metric != named.end()) {
        sig = static_cast<Signal>(metric - named.begin());
        keys_seen_ |= core::Bit(sig);
        if (val.type == core::JsonValue::Type::kNull) continue;
        if (val.type == core::JsonValue::Type::kString) {
          // "nan", "inf" as strings are what some writers emit.
          double d;
          if (!ParseDouble(val.string, &d)) {
            return At(source_, line_no, val.column,
                      absl::StrCat(key, " \"", val.string, "\" is not a number"));
          }
          b.SetValue(row, sig, d);
          continue;
        }
        if (val.type != core::JsonValue::Type::kNumber) {
          return At(source_, line_no, val.column, absl::StrCat(key, " must be a number"));
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
            if (id.type == core::JsonValue::Type::kString) {
              if (absl::Status s = b.AddShardName(row, id.string, id.column); !s.ok()) return s;
              continue;
            }
            if (id.type != core::JsonValue::Type::kNumber || id.number < 0 ||
                id.number != std::floor(id.number)) {
              return At(source_, line_no, id.column,
                        "shard ids must be non-negative integers or names (strings)");
            }
            // The literal, not the double: ids beyond 2^53 stay exact.
            uint64_t exact;
            if (!ParseUint64(id.string, &exact)) exact = static_cast<uint64_t>(id.number);
            b.AddShard(row, exact);
          }
        } else if (val.type != core::JsonValue::Type::kNull) {
          return At(source_, line_no, val.column,
                    "shard must be an id, a list of ids and names or a string \"a;b\"");
        }
      } else if (key == "checkpoint") {
        if (val.type == core::JsonValue::Type::kString) {
          b.SetCheckpoint(row, val.string);
        } else if (val.type != core::JsonValue::Type::kNull) {
          return At(source_, line_no, val.column, "checkpoint must be a string (a uri)");
        }
      }
      // Other keys are read past, as extra CSV columns are.
    }
    return absl::OkStatus();
  }

  // A metric no line has is unknown, as in every other format (and as twctl
  // follow reads the same lines); a file without even a loss is not a
  // training log's metrics: an error naming the keys it has.
  absl::Status End(const TraceBuilder&) override {
    if (lines_ > 0 && !(keys_seen_ & core::Bit(Signal::kLoss))) {
      return At(source_, 1, 1,
                absl::StrCat("no line has a loss (its keys: ",
                             keys_.empty() ? "none but step" : absl::StrJoin(keys_, ", "),
                             keys_.size() == kKeysShown ? ", ..." : "",
                             "); expected loss, and grad_norm, log_z, nan_frac where known"));
    }
    return absl::OkStatus();
  }

 private:
  static constexpr size_t kKeysShown = 16;
  absl::string_view source_;
  uint32_t keys_seen_ = 0;
  int64_t lines_ = 0;
  std::vector<std::string> keys_;  // the first kKeysShown other than step, for the error
};

}  // namespace

std::unique_ptr<LineParser> NewJsonLinesParser(absl::string_view source) {
  return std::make_unique<JsonLinesParser>(source);
}

}  // namespace trainwatch::logs
