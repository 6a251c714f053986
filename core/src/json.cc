#include "trainwatch/core/json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"

namespace trainwatch::core {

const JsonValue* JsonValue::Find(absl::string_view key) const {
  for (const auto& [k, v] : object) {
    if (k == key) return &v;
  }
  return nullptr;
}

namespace {

// Nesting deeper than this is refused rather than risking the stack.
constexpr int kMaxDepth = 64;

class Parser {
 public:
  Parser(absl::string_view text, absl::string_view source, int first_line)
      : text_(text), source_(source), line_(first_line) {}

  absl::StatusOr<JsonValue> Document() {
    JsonValue v;
    if (absl::Status s = Value(&v, 0); !s.ok()) return s;
    SkipSpace();
    if (pos_ < text_.size()) return Error("unexpected text after the JSON value");
    return v;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s:%d:%d: %s", source_, line_, Column(), what));
  }
  int Column() const { return static_cast<int>(pos_ - line_start_) + 1; }

  void SkipSpace() {
    while (pos_ < text_.size()) {
      const char ch = text_[pos_];
      if (ch == '\n') {
        ++line_;
        line_start_ = ++pos_;
      } else if (ch == ' ' || ch == '\t' || ch == '\r') {
        ++pos_;
      } else {
        break;
      }
    }
  }

  bool Consume(absl::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  absl::Status Value(JsonValue* v, int depth) {
    SkipSpace();
    if (depth > kMaxDepth) return Error("nesting too deep");
    v->line = line_;
    v->column = Column();
    if (pos_ >= text_.size()) return Error("unexpected end of input, a value was expected");
    const char ch = text_[pos_];
    if (ch == '{') return Object(v, depth);
    if (ch == '[') return Array(v, depth);
    if (ch == '"') {
      v->type = JsonValue::Type::kString;
      return String(&v->string);
    }
    if (Consume("true")) {
      v->type = JsonValue::Type::kBool;
      v->boolean = true;
      return absl::OkStatus();
    }
    if (Consume("false")) {
      v->type = JsonValue::Type::kBool;
      return absl::OkStatus();
    }
    if (Consume("null")) {
      v->type = JsonValue::Type::kNull;
      return absl::OkStatus();
    }
    v->type = JsonValue::Type::kNumber;
    if (Consume("NaN")) {
      v->number = std::numeric_limits<double>::quiet_NaN();
      return absl::OkStatus();
    }
    if (Consume("Infinity")) {
      v->number = std::numeric_limits<double>::infinity();
      return absl::OkStatus();
    }
    if (Consume("-Infinity")) {
      v->number = -std::numeric_limits<double>::infinity();
      return absl::OkStatus();
    }
    const size_t start = pos_;
    absl::Status st = Number(&v->number);
    // The literal too: integers beyond 2^53 (shard ids) read exactly from it.
    if (st.ok()) v->string.assign(text_.data() + start, pos_ - start);
    return st;
  }

  absl::Status Number(double* out) {
    size_t end = pos_;
    if (end < text_.size() && text_[end] == '-') ++end;
    const size_t digits = end;
    while (end < text_.size() && text_[end] >= '0' && text_[end] <= '9') ++end;
    if (end == digits) return Error("not a JSON value");
    if (end - digits > 1 && text_[digits] == '0') return Error("leading zero in a number");
    if (end < text_.size() && text_[end] == '.') {
      ++end;
      const size_t frac = end;
      while (end < text_.size() && text_[end] >= '0' && text_[end] <= '9') ++end;
      if (end == frac) return Error("a digit must follow the decimal point");
    }
    if (end < text_.size() && (text_[end] == 'e' || text_[end] == 'E')) {
      ++end;
      if (end < text_.size() && (text_[end] == '+' || text_[end] == '-')) ++end;
      const size_t exp = end;
      while (end < text_.size() && text_[end] >= '0' && text_[end] <= '9') ++end;
      if (end == exp) return Error("a digit must follow the exponent");
    }
    const auto res = std::from_chars(text_.data() + pos_, text_.data() + end, *out);
    if (res.ec == std::errc::result_out_of_range) {
      // Out-of-range literals saturate the way strtod does.
      *out = std::strtod(std::string(text_.substr(pos_, end - pos_)).c_str(), nullptr);
    } else if (res.ec != std::errc() || res.ptr != text_.data() + end) {
      return Error("malformed number");
    }
    pos_ = end;
    return absl::OkStatus();
  }

  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  absl::Status Hex4(uint32_t* cp) {
    if (pos_ + 4 > text_.size()) return Error("truncated \\u escape");
    *cp = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = text_[pos_++];
      *cp <<= 4;
      if (h >= '0' && h <= '9') *cp |= static_cast<uint32_t>(h - '0');
      else if (h >= 'a' && h <= 'f') *cp |= static_cast<uint32_t>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') *cp |= static_cast<uint32_t>(h - 'A' + 10);
      else return Error("bad hex digit in \\u escape");
    }
    return absl::OkStatus();
  }

  absl::Status String(std::string* out) {
    ++pos_;  // opening quote
    while (pos_ < text_.size()) {
      const char ch = text_[pos_];
      if (ch == '"') {
        ++pos_;
        return absl::OkStatus();
      }
      if (static_cast<unsigned char>(ch) < 0x20) return Error("control character in string");
      if (ch != '\\') {
        out->push_back(ch);
        ++pos_;
        continue;
      }
      if (++pos_ >= text_.size()) break;
      const char esc = text_[pos_++];
      switch (esc) {
        case '"': out->push_back('"'); break;
        case '\\': out->push_back('\\'); break;
        case '/': out->push_back('/'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
        case 'u': {
          uint32_t cp = 0;
          if (absl::Status s = Hex4(&cp); !s.ok()) return s;
          if (cp >= 0xD800 && cp < 0xDC00) {
            uint32_t lo = 0;
            if (!Consume("\\u")) return Error("unpaired surrogate in \\u escape");
            if (absl::Status s = Hex4(&lo); !s.ok()) return s;
            if (lo < 0xDC00 || lo > 0xDFFF) return Error("unpaired surrogate in \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          --pos_;
          return Error("unknown escape in string");
      }
    }
    return Error("unterminated string");
  }

  absl::Status Array(JsonValue* v, int depth) {
    v->type = JsonValue::Type::kArray;
    ++pos_;
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == ']') {
      ++pos_;
      return absl::OkStatus();
    }
    for (;;) {
      v->array.emplace_back();
      if (absl::Status s = Value(&v->array.back(), depth + 1); !s.ok()) return s;
      SkipSpace();
      if (pos_ >= text_.size()) return Error("unterminated array");
      if (text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (text_[pos_] == ']') {
        ++pos_;
        return absl::OkStatus();
      }
      return Error("expected ',' or ']' in array");
    }
  }

  absl::Status Object(JsonValue* v, int depth) {
    v->type = JsonValue::Type::kObject;
    ++pos_;
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == '}') {
      ++pos_;
      return absl::OkStatus();
    }
    for (;;) {
      SkipSpace();
      if (pos_ >= text_.size() || text_[pos_] != '"') return Error("expected a quoted key");
      std::string key;
      const int key_line = line_, key_col = Column();
      if (absl::Status s = String(&key); !s.ok()) return s;
      if (v->Find(key) != nullptr) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s:%d:%d: duplicate key \"%s\"", source_, key_line, key_col, key));
      }
      SkipSpace();
      if (pos_ >= text_.size() || text_[pos_] != ':') return Error("expected ':' after key");
      ++pos_;
      v->object.emplace_back(std::move(key), JsonValue{});
      if (absl::Status s = Value(&v->object.back().second, depth + 1); !s.ok()) return s;
      SkipSpace();
      if (pos_ >= text_.size()) return Error("unterminated object");
      if (text_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (text_[pos_] == '}') {
        ++pos_;
        return absl::OkStatus();
      }
      return Error("expected ',' or '}' in object");
    }
  }

  absl::string_view text_;
  absl::string_view source_;
  size_t pos_ = 0;
  int line_;
  size_t line_start_ = 0;
};

}  // namespace

absl::StatusOr<JsonValue> ParseJson(absl::string_view text, absl::string_view source,
                                    int first_line) {
  return Parser(text, source, first_line).Document();
}

void AppendJsonStrings(std::string* out, const std::vector<std::string>& strings) {
  out->push_back('[');
  for (size_t i = 0; i < strings.size(); ++i) {
    if (i) out->push_back(',');
    AppendJsonString(out, strings[i]);
  }
  out->push_back(']');
}

void AppendJsonString(std::string* out, absl::string_view s) {
  out->push_back('"');
  for (const char ch : s) {
    switch (ch) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20) {
          absl::StrAppendFormat(out, "\\u%04x", static_cast<int>(ch));
        } else {
          out->push_back(ch);
        }
    }
  }
  out->push_back('"');
}

void AppendJsonNumber(std::string* out, double v) {
  if (!std::isfinite(v)) {
    out->append("null");
    return;
  }
  if (v == std::floor(v) && std::fabs(v) < 9.0e15) {
    absl::StrAppend(out, static_cast<int64_t>(v));
    return;
  }
  char buf[32];
  // Shortest representation that reads back to the same double.
  const auto res = std::to_chars(buf, buf + sizeof(buf), v);
  out->append(buf, res.ptr);
}

void AppendRecommendedActionsJson(std::string* out,
                                  const std::vector<RecommendedAction>& actions) {
  out->push_back('[');
  for (size_t i = 0; i < actions.size(); ++i) {
    const RecommendedAction& a = actions[i];
    if (i) out->push_back(',');
    out->append("{\"kind\":");
    AppendJsonString(out, RecommendedActionKindName(a.kind));
    switch (a.kind) {
      case RecommendedAction::Kind::kQuarantineShards:
      case RecommendedAction::Kind::kInspectShards:
        // A names-only action has no range; rows from before names always do.
        if (a.has_shard_range) {
          absl::StrAppend(out, ",\"shard_first\":", a.shard_first,
                          ",\"shard_last\":", a.shard_last);
        }
        // Only when there are names, so that rows written before names
        // existed and rows without names read the same.
        if (!a.shard_names.empty()) {
          out->append(",\"shard_names\":");
          AppendJsonStrings(out, a.shard_names);
        }
        break;
      case RecommendedAction::Kind::kSetZLossAlpha:
        out->append(",\"z_loss_alpha\":");
        AppendJsonNumber(out, a.z_loss_alpha);
        break;
      case RecommendedAction::Kind::kWidenPrecision:
        out->append(",\"tensor\":");
        AppendJsonString(out, a.tensor);
        break;
    }
    out->append(",\"text\":");
    AppendJsonString(out, a.text);
    out->push_back('}');
  }
  out->push_back(']');
}

absl::StatusOr<std::vector<RecommendedAction>> ParseRecommendedActionsJson(
    absl::string_view text, absl::string_view source) {
  absl::StatusOr<JsonValue> doc = ParseJson(text, source);
  if (!doc.ok()) return doc.status();
  if (doc->type != JsonValue::Type::kArray) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not an array of actions"));
  }
  auto error = [&](const JsonValue& at, absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s:%d:%d: %s", source, at.line, at.column, what));
  };
  auto field = [&](const JsonValue& a, absl::string_view key,
                   JsonValue::Type type) -> absl::StatusOr<const JsonValue*> {
    const JsonValue* v = a.Find(key);
    if (v == nullptr || v->type != type) {
      return error(a, absl::StrCat("an action needs \"", key, "\" of the right type"));
    }
    return v;
  };
  std::vector<RecommendedAction> out;
  for (const JsonValue& a : doc->array) {
    absl::StatusOr<const JsonValue*> kind = field(a, "kind", JsonValue::Type::kString);
    if (!kind.ok()) return kind.status();
    absl::StatusOr<const JsonValue*> text_field = field(a, "text", JsonValue::Type::kString);
    if (!text_field.ok()) return text_field.status();
    RecommendedAction r;
    r.text = (*text_field)->string;
    bool known = false;
    for (auto k : {RecommendedAction::Kind::kQuarantineShards,
                   RecommendedAction::Kind::kInspectShards,
                   RecommendedAction::Kind::kSetZLossAlpha,
                   RecommendedAction::Kind::kWidenPrecision}) {
      if (RecommendedActionKindName(k) == (*kind)->string) {
        r.kind = k;
        known = true;
      }
    }
    if (!known) return error(a, absl::StrCat("unknown action kind \"", (*kind)->string, "\""));
    switch (r.kind) {
      case RecommendedAction::Kind::kQuarantineShards:
      case RecommendedAction::Kind::kInspectShards: {
        r.has_shard_range = a.Find("shard_first") != nullptr || a.Find("shard_names") == nullptr;
        if (const JsonValue* names = a.Find("shard_names"); names != nullptr) {
          if (names->type != JsonValue::Type::kArray) {
            return error(*names, "shard_names must be an array of strings");
          }
          for (const JsonValue& n : names->array) {
            if (n.type != JsonValue::Type::kString) {
              return error(n, "shard_names must be an array of strings");
            }
            r.shard_names.push_back(n.string);
          }
        }
        if (!r.has_shard_range) break;
        absl::StatusOr<const JsonValue*> first = field(a, "shard_first", JsonValue::Type::kNumber);
        absl::StatusOr<const JsonValue*> last = field(a, "shard_last", JsonValue::Type::kNumber);
        if (!first.ok()) return first.status();
        if (!last.ok()) return last.status();
        if (!absl::SimpleAtoi((*first)->string, &r.shard_first) ||
            !absl::SimpleAtoi((*last)->string, &r.shard_last)) {
          return error(a, "shard ids must be non-negative integers");
        }
        break;
      }
      case RecommendedAction::Kind::kSetZLossAlpha: {
        absl::StatusOr<const JsonValue*> alpha =
            field(a, "z_loss_alpha", JsonValue::Type::kNumber);
        if (!alpha.ok()) return alpha.status();
        r.z_loss_alpha = (*alpha)->number;
        break;
      }
      case RecommendedAction::Kind::kWidenPrecision: {
        absl::StatusOr<const JsonValue*> tensor = field(a, "tensor", JsonValue::Type::kString);
        if (!tensor.ok()) return tensor.status();
        r.tensor = (*tensor)->string;
        break;
      }
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace trainwatch::core
