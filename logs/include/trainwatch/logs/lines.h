// Lines of a text, the way every reader of replay walks them: split at '\n',
// a trailing '\r' dropped, numbered from 1 for error messages; and the
// number fast path every reader's ParseDouble takes first.

#ifndef TRAINWATCH_LOGS_LINES_H_
#define TRAINWATCH_LOGS_LINES_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <istream>
#include <string>

#include "absl/strings/string_view.h"
#include "trainwatch/core/large_allocator.h"

namespace trainwatch::logs {

// A whole metrics file read at once, on huge pages (large_allocator.h).
using LargeString = std::basic_string<char, std::char_traits<char>, core::LargeAllocator<char>>;

// All of `in` into *content, in large blocks straight into the string: sized
// once when `size_hint` (a regular file's size, 0 when unknown) is right,
// read on in 1 MiB blocks past it (a pipe, a growing log). Not a character
// at a time through istreambuf_iterator, nor through a bounce buffer. False
// on a read error.
// `String`: std::string, or LargeString for a whole log (see
// large_allocator.h).
template <typename String>
bool ReadStream(std::istream& in, size_t size_hint, String* content) {
  constexpr size_t kBlock = size_t{1} << 20;
  content->clear();
  // One more than the size, so that the read that meets the end fits too.
  content->reserve(size_hint + 1);
  for (;;) {
    const size_t have = content->size();
    content->resize(have + std::max(kBlock, content->capacity() - have));
    in.read(content->data() + have, static_cast<std::streamsize>(content->size() - have));
    content->resize(have + static_cast<size_t>(in.gcount()));
    if (!in) return !in.bad();
  }
}

// The number of '\n' in `text`: an upper bound on its lines less one, for
// reserving a trace's rows once. memchr per line, not std::count per byte
// (which the compiler leaves a byte at a time: a twentieth of a 500k-step
// replay).
inline size_t CountNewlines(absl::string_view text) {
  size_t n = 0;
  const char* p = text.data();
  const char* const end = p + text.size();
  while (p < end) {
    const void* hit = std::memchr(p, '\n', static_cast<size_t>(end - p));
    if (hit == nullptr) break;
    ++n;
    p = static_cast<const char*>(hit) + 1;
  }
  return n;
}

// A plain decimal ("-12.5", "3.99226", "1e-05", "7") by Clinger's fast path:
// when its digits as an integer M are at most 2^53 and its power of ten p
// has |p| <= 22, both M and 10^|p| are exact doubles, so the one multiply or
// divide is correctly rounded: the same double std::from_chars gives, at a
// fraction of its cost (the largest part of reading a metrics CSV). False
// for anything else (more digits, nan, inf, no digit before or after a '.',
// any other character), which the caller then hands to std::from_chars.
inline bool ParseDecimalFast(absl::string_view text, double* out) {
  static constexpr double kPow10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                      1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                      1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
  constexpr uint64_t kMaxExact = uint64_t{1} << 53;
  const char* p = text.data();
  const char* const end = p + text.size();
  const bool negative = p < end && *p == '-';
  if (negative) ++p;
  uint64_t m = 0;
  int exp10 = 0;
  const char* const int_begin = p;
  for (; p < end && *p >= '0' && *p <= '9'; ++p) {
    m = m * 10 + static_cast<uint64_t>(*p - '0');
    if (m > kMaxExact) return false;
  }
  if (p == int_begin) return false;
  if (p < end && *p == '.') {
    const char* const frac_begin = ++p;
    for (; p < end && *p >= '0' && *p <= '9'; ++p) {
      m = m * 10 + static_cast<uint64_t>(*p - '0');
      if (m > kMaxExact) return false;
    }
    if (p == frac_begin) return false;
    exp10 = -static_cast<int>(p - frac_begin);
  }
  if (p < end && (*p == 'e' || *p == 'E')) {
    ++p;
    const bool exp_negative = p < end && *p == '-';
    if (p < end && (*p == '-' || *p == '+')) ++p;
    const char* const exp_begin = p;
    int e = 0;
    for (; p < end && *p >= '0' && *p <= '9' && p - exp_begin < 4; ++p) e = e * 10 + (*p - '0');
    if (p == exp_begin) return false;
    exp10 += exp_negative ? -e : e;
  }
  if (p != end || exp10 < -22 || exp10 > 22) return false;
  double v = static_cast<double>(m);
  v = exp10 < 0 ? v / kPow10[-exp10] : v * kPow10[exp10];
  *out = negative ? -v : v;
  return true;
}

class LineReader {
 public:
  explicit LineReader(absl::string_view content) : content_(content) {}

  // The next line, or false at the end.
  bool Next(absl::string_view* line) {
    if (pos_ >= content_.size()) return false;
    // memchr itself: absl's find() is an out-of-line call around it.
    const void* hit = std::memchr(content_.data() + pos_, '\n', content_.size() - pos_);
    const size_t end = hit == nullptr ? content_.size()
                                      : static_cast<size_t>(static_cast<const char*>(hit) -
                                                            content_.data());
    *line = content_.substr(pos_, end - pos_);
    pos_ = end + 1;
    ++line_no_;
    if (!line->empty() && line->back() == '\r') line->remove_suffix(1);
    return true;
  }
  // The number of the line Next() gave last.
  int line_no() const { return line_no_; }

 private:
  absl::string_view content_;
  size_t pos_ = 0;
  int line_no_ = 0;
};

}  // namespace trainwatch::logs

#endif  // TRAINWATCH_LOGS_LINES_H_
