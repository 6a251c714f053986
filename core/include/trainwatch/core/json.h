// A small JSON reader and writer for the project's own formats (metrics as
// JSON lines, configuration files, `-o json` output). The reader keeps the
// line and column of every value, so that an error in user input can say
// exactly where it is.

#ifndef TRAINWATCH_CORE_JSON_H_
#define TRAINWATCH_CORE_JSON_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainwatch/core/event.h"

namespace trainwatch::core {

struct JsonValue {
  enum class Type : uint8_t { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = Type::kNull;
  bool boolean = false;
  double number = 0.0;
  std::string string;  // for a number: its literal as written
  std::vector<JsonValue> array;
  // Members in input order; duplicate keys are rejected by the parser.
  std::vector<std::pair<std::string, JsonValue>> object;
  int line = 1;    // where the value starts, 1-based
  int column = 1;  // 1-based, in bytes

  const JsonValue* Find(absl::string_view key) const;
};

// Parses one JSON document. Besides standard JSON, the bare words NaN,
// Infinity and -Infinity are accepted as numbers (as Python's json module
// writes them), since metrics files carry them. Errors read
// "<source>:<line>:<column>: <what>"; `first_line` offsets line numbers when
// the text is one line of a larger file.
absl::StatusOr<JsonValue> ParseJson(absl::string_view text,
                                    absl::string_view source,
                                    int first_line = 1);

// Appends `s` as a JSON string literal (quoted, escaped).
void AppendJsonString(std::string* out, absl::string_view s);
// Appends `strings` as a JSON array of string literals.
void AppendJsonStrings(std::string* out, const std::vector<std::string>& strings);
// Appends a number; NaN and infinities become null (JSON has no literal for
// them), integers print without a fraction.
void AppendJsonNumber(std::string* out, double v);

// Appends recommended actions as a JSON array of objects with "kind",
// "text" and the kind's parameters (shard_first/shard_last, z_loss_alpha,
// tensor): the form replay prints and the server stores.
void AppendRecommendedActionsJson(std::string* out,
                                  const std::vector<RecommendedAction>& actions);
// Its inverse, whole or not at all: an unknown kind, a missing or mistyped
// field, or a shard id that is not an exact unsigned integer is an error
// naming `source`, line and column.
absl::StatusOr<std::vector<RecommendedAction>> ParseRecommendedActionsJson(
    absl::string_view text, absl::string_view source);

}  // namespace trainwatch::core

#endif  // TRAINWATCH_CORE_JSON_H_
