#include "trainwatch/core/shard_names.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace trainwatch::core {

absl::Status CheckShardNameCount(absl::string_view what, size_t count) {
  if (count <= kMaxShardNamesPerRecord) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", count, " shard names, above the ",
                                                 kMaxShardNamesPerRecord,
                                                 " a record may carry"));
}

absl::Status CheckShardName(absl::string_view what, absl::string_view name) {
  if (name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": a shard name is empty"));
  }
  if (name.size() > kMaxShardNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": shard name \"", name.substr(0, 32), "...\" is ", name.size(),
        " bytes, above the ", kMaxShardNameBytes, " a shard name may have"));
  }
  return absl::OkStatus();
}

absl::Status CheckShardNames(absl::string_view what, absl::Span<const std::string> names) {
  if (absl::Status s = CheckShardNameCount(what, names.size()); !s.ok()) return s;
  for (const std::string& name : names) {
    if (absl::Status s = CheckShardName(what, name); !s.ok()) return s;
  }
  return absl::OkStatus();
}

namespace {

bool AllDigits(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// "digits..digits": the two ends, else false.
bool SplitRange(absl::string_view s, absl::string_view* a, absl::string_view* b) {
  const size_t dots = s.find("..");
  if (dots == absl::string_view::npos) return false;
  *a = s.substr(0, dots);
  *b = s.substr(dots + 2);
  return AllDigits(*a) && AllDigits(*b);
}

absl::Status AddEntry(absl::string_view entry, bool escaped, ShardList* out) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("shard list entry \"", entry, "\": ", why));
  };
  if (entry.empty()) return bad("is empty");
  absl::string_view a, b;
  if (!escaped && AllDigits(entry)) {
    uint64_t id;
    if (!absl::SimpleAtoi(entry, &id)) return bad("the id does not fit in 64 bits");
    out->ranges.emplace_back(id, id);
  } else if (!escaped && SplitRange(entry, &a, &b)) {
    uint64_t first, last;
    if (!absl::SimpleAtoi(a, &first) || !absl::SimpleAtoi(b, &last)) {
      return bad("an id does not fit in 64 bits");
    }
    if (last < first) return bad("a range A..B needs A <= B");
    out->ranges.emplace_back(first, last);
  } else {
    if (absl::Status s = CheckShardName("shard list", entry); !s.ok()) return s;
    out->names.emplace_back(entry);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ShardList> ParseShardList(absl::string_view text) {
  ShardList out;
  if (text.empty()) return absl::InvalidArgumentError("the shard list is empty");
  std::string entry;
  bool escaped = false;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == ',') {
      if (absl::Status s = AddEntry(entry, escaped, &out); !s.ok()) return s;
      entry.clear();
      escaped = false;
    } else if (text[i] == '\\') {
      if (++i == text.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("shard list \"", text, "\" ends in a lone '\\'"));
      }
      entry.push_back(text[i]);
      escaped = true;
    } else {
      entry.push_back(text[i]);
    }
  }
  if (absl::Status s = CheckShardNameCount("shard list", out.names.size()); !s.ok()) return s;
  return out;
}

std::string ShardListEntry(absl::string_view name) {
  std::string out;
  absl::string_view a, b;
  // A name that would read as an id or a range is marked by one escape.
  if (AllDigits(name) || SplitRange(name, &a, &b)) out.push_back('\\');
  for (char c : name) {
    if (c == ',' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

}  // namespace trainwatch::core
