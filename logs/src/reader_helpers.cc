#include "reader_helpers.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace trainwatch::logs {

absl::Status NoRecords(const TraceBuilder& b, absl::string_view source, absl::string_view what) {
  if (b.rows() > 0) return absl::OkStatus();
  return At(source, 1, 1, absl::StrCat("no ", what, " lines: nothing to replay"));
}

int ColumnOf(absl::string_view line, absl::string_view part) {
  return static_cast<int>(part.data() - line.data()) + 1;
}

bool AllDigits(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

absl::string_view DigitsAt(absl::string_view s, size_t i, size_t* end) {
  size_t j = i;
  while (j < s.size() && absl::ascii_isdigit(static_cast<unsigned char>(s[j]))) ++j;
  *end = j;
  return s.substr(i, j - i);
}

bool TqdmBar(absl::string_view seg, int64_t* n, int64_t* total) {
  for (size_t bar = seg.find('|'); bar != absl::string_view::npos; bar = seg.find('|', bar + 1)) {
    size_t i = bar + 1;
    while (i < seg.size() && seg[i] == ' ') ++i;
    size_t end;
    const absl::string_view num = DigitsAt(seg, i, &end);
    if (num.empty() || end >= seg.size() || seg[end] != '/') continue;
    const absl::string_view tot = DigitsAt(seg, end + 1, &end);
    if (tot.empty() || seg.substr(end, 2) != " [") continue;
    if (ParseInt64(num, n) && ParseInt64(tot, total)) return true;
  }
  return false;
}

bool PythonDict(absl::string_view text, std::vector<DictEntry>* out) {
  out->clear();
  size_t i = 1;
  auto skip = [&] {
    while (i < text.size() && text[i] == ' ') ++i;
  };
  for (;;) {
    skip();
    if (i >= text.size()) return false;
    if (text[i] == '}') return true;
    const char q = text[i];
    if (q != '\'' && q != '"') return false;
    const size_t key_begin = ++i;
    while (i < text.size() && text[i] != q) i += text[i] == '\\' ? 2 : 1;
    if (i >= text.size()) return false;
    const absl::string_view key = text.substr(key_begin, i - key_begin);
    ++i;
    skip();
    if (i >= text.size() || text[i] != ':') return false;
    ++i;
    skip();
    const size_t value_begin = i;
    int depth = 0;
    char in_quote = 0;
    for (; i < text.size(); ++i) {
      const char c = text[i];
      if (in_quote != 0) {
        if (c == '\\') {
          ++i;
        } else if (c == in_quote) {
          in_quote = 0;
        }
      } else if (c == '\'' || c == '"') {
        in_quote = c;
      } else if (c == '(' || c == '[' || c == '{') {
        ++depth;
      } else if (c == ')' || c == ']' || (c == '}' && depth > 0)) {
        --depth;
      } else if (depth == 0 && (c == ',' || c == '}')) {
        break;
      }
    }
    if (i >= text.size()) return false;
    out->push_back({key, absl::StripAsciiWhitespace(text.substr(value_begin, i - value_begin))});
    if (text[i] == ',') ++i;
  }
}

bool PythonNumber(absl::string_view v, double* out) {
  if (v.size() >= 2 && (v.front() == '\'' || v.front() == '"') && v.back() == v.front()) {
    v = v.substr(1, v.size() - 2);
  } else if (absl::ConsumePrefix(&v, "tensor(")) {
    v = v.substr(0, v.find_first_of(",)"));
  }
  return ParseDouble(absl::StripAsciiWhitespace(v), out);
}

absl::string_view DictSegment(absl::string_view line) {
  for (absl::string_view seg : absl::StrSplit(line, '\r')) {
    absl::string_view s = absl::StripLeadingAsciiWhitespace(seg);
    if (s.size() >= 2 && s[0] == '{' && (s[1] == '\'' || s[1] == '}')) {
      return absl::StripTrailingAsciiWhitespace(s);
    }
    const size_t after_bar = s.find("]{'");
    if (after_bar != absl::string_view::npos && s.find('|') < after_bar) {
      return absl::StripTrailingAsciiWhitespace(s.substr(after_bar + 1));
    }
  }
  return absl::string_view();
}

}  // namespace trainwatch::logs
