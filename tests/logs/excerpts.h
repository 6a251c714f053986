// The trainers' log excerpts in tests/data/formats (see their README), and
// the damage every reader must survive on them.

#ifndef TRAINWATCH_TESTS_LOGS_EXCERPTS_H_
#define TRAINWATCH_TESTS_LOGS_EXCERPTS_H_

#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "trainwatch/core/rule_engine.h"
#include "trainwatch/logs/metrics_file.h"
#include "trainwatch/logs/replay.h"

namespace trainwatch::logs {

inline std::string Excerpt(const std::string& name) {
  std::ifstream in(std::string(TRAINWATCH_FORMATS_DIR) + "/" + name, std::ios::binary);
  REQUIRE(in);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Damaged copies of each excerpt, read in each format: cut every `cut_every`
// bytes, a byte overwritten every `junk_every` with one the readers split or
// stop on, and the log twice (a restart from its first step). Each copy
// parses or fails with a message naming the input, and what parses replays
// with every record. Both outcomes must occur, or the damage tested nothing.
inline void CheckDamagedCopies(const std::vector<std::string>& names,
                               std::initializer_list<MetricsFormat> formats, ReadOptions options,
                               size_t cut_every, size_t junk_every) {
  const char kJunk[] = {'\0',   '\n', ':', ',', '|',  '[', ']',  '9',    '-', 'e',
                        '\xff', ' ',  '{', '}', '\'', '"', '\r', '\x1b', '\t'};
  int parsed = 0, refused = 0;
  for (const std::string& name : names) {
    const std::string text = Excerpt(name);
    std::vector<std::string> copies;
    for (size_t cut = 0; cut < text.size(); cut += cut_every) copies.push_back(text.substr(0, cut));
    for (size_t at = 0; at < text.size(); at += junk_every) {
      std::string v = text;
      v[at] = kJunk[at % sizeof(kJunk)];
      copies.push_back(v);
    }
    copies.push_back(text + text);
    for (const std::string& v : copies) {
      for (MetricsFormat f : formats) {
        options.format = f;
        auto t = ParseMetrics(v, "damaged.log", options);
        if (!t.ok()) {
          ++refused;
          CHECK(t.status().message().find("damaged.log") != absl::string_view::npos);
          continue;
        }
        ++parsed;
        auto r = Replay(*t, core::RuleConfig());
        REQUIRE(r.ok());
        CHECK(r->records == static_cast<int64_t>(t->size()));
      }
    }
  }
  CHECK(parsed > 0);
  CHECK(refused > 0);
}

}  // namespace trainwatch::logs

#endif  // TRAINWATCH_TESTS_LOGS_EXCERPTS_H_
