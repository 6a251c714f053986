// --pattern: a template or a named-group regex, compiled to one RE2 regex,
// and the line reader it makes.

#include "trainwatch/logs/line_pattern.h"

#include <re2/re2.h>

#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "trainwatch/logs/trace_builder.h"

namespace trainwatch::logs {

namespace {

using core::Signal;

// A number as trainers print one (C's and Python's formats, nan and inf).
constexpr absl::string_view kNumber =
    R"([-+]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|(?i:nan|inf(?:inity)?)))";

bool IsIdentifier(absl::string_view s) {
  if (s.empty() || absl::ascii_isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  return true;
}

// `pattern` with each (?<name> written as RE2's (?P<name>; escapes and
// character classes are copied as they are.
std::string RewriteNamedGroups(absl::string_view p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      absl::StrAppend(&out, p.substr(i, 2));
      ++i;
      continue;
    }
    if (in_class) {
      in_class = c != ']';
    } else if (c == '[') {
      in_class = true;
    } else if (p.substr(i, 3) == "(?<" && i + 3 < p.size() && p[i + 3] != '=' && p[i + 3] != '!') {
      out += "(?P<";
      i += 2;
      continue;
    }
    out += c;
  }
  return out;
}

// A template's regex: {NAME} a number, {} any text, spaces one or more.
absl::StatusOr<std::string> TemplateRegex(absl::string_view t) {
  std::string out;
  bool any_field = false;
  for (size_t i = 0; i < t.size();) {
    const char c = t[i];
    if ((c == '{' || c == '}') && i + 1 < t.size() && t[i + 1] == c) {
      absl::StrAppend(&out, "\\", std::string(1, c));
      i += 2;
    } else if (c == '{') {
      const size_t close = t.find('}', i);
      if (close == absl::string_view::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("--pattern: the '{' at column ", i + 1, " is not closed (write {{ for a "
                         "brace itself)"));
      }
      const absl::string_view name = t.substr(i + 1, close - i - 1);
      if (name.empty()) {
        out += ".*?";
      } else if (!IsIdentifier(name)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--pattern: {", name, "} is not a field: a name of letters, digits and _, or {}"));
      } else {
        absl::StrAppend(&out, "(?P<", name, ">", name == "step" ? "[0-9]+" : kNumber, ")");
        any_field = true;
      }
      i = close + 1;
    } else if (c == '}') {
      return absl::InvalidArgumentError(absl::StrCat(
          "--pattern: the '}' at column ", i + 1, " closes nothing (write }} for a brace itself)"));
    } else if (c == ' ' || c == '\t') {
      while (i < t.size() && (t[i] == ' ' || t[i] == '\t')) ++i;
      out += "\\s+";
    } else {
      out += RE2::QuoteMeta(re2::StringPiece(&t[i], 1));
      ++i;
    }
  }
  if (!any_field) {
    return absl::InvalidArgumentError(
        "--pattern has no field: name the step and the loss, e.g. 'step {step} loss {loss}', or "
        "give a regex with named groups (?<step>...) and (?<loss>...)");
  }
  return out;
}

}  // namespace

absl::StatusOr<NamedRegex> NamedRegex::Compile(absl::string_view pattern,
                                               absl::string_view flag) {
  RE2::Options options;
  options.set_log_errors(false);
  const std::string rewritten = RewriteNamedGroups(pattern);
  auto re = std::make_shared<const RE2>(rewritten, options);
  if (!re->ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " \"", pattern, "\" is not a regex: ", re->error()));
  }
  NamedRegex r;
  for (const auto& [name, index] : re->NamedCapturingGroups()) r.named_[name] = index;
  r.groups_ = re->NumberOfCapturingGroups();
  r.re_ = std::move(re);
  return r;
}

bool NamedRegex::Search(absl::string_view line, std::vector<absl::string_view>* captures) const {
  std::vector<re2::StringPiece> found(static_cast<size_t>(groups_) + 1);
  if (!re_->Match(re2::StringPiece(line.data(), line.size()), 0, line.size(), RE2::UNANCHORED,
                  found.data(), static_cast<int>(found.size()))) {
    return false;
  }
  captures->clear();
  for (const re2::StringPiece& f : found) captures->emplace_back(f.data(), f.size());
  return true;
}

absl::StatusOr<std::shared_ptr<const LinePattern>> LinePattern::Compile(absl::string_view text) {
  auto p = std::make_shared<LinePattern>();
  p->text_ = std::string(text);
  const bool regex = absl::StrContains(text, "(?<") || absl::StrContains(text, "(?P<");
  if (regex) {
    p->regex_ = p->text_;
  } else {
    absl::StatusOr<std::string> r = TemplateRegex(text);
    if (!r.ok()) return r.status();
    p->regex_ = *std::move(r);
  }
  absl::StatusOr<NamedRegex> re = NamedRegex::Compile(p->regex_, "--pattern");
  if (!re.ok()) return re.status();
  p->re_ = *std::move(re);
  std::set<Signal> taken;
  for (const auto& [name, group] : p->re_.named()) {
    Signal s;
    if (name == "step") {
      p->step_group_ = group;
      continue;
    }
    if (!SignalByName(name, &s) && !SignalByAlias(absl::AsciiStrToLower(name), &s)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--pattern: unknown field \"", name,
          "\": the fields are step, loss, grad_norm, log_z, nan_frac, lr, z_loss_alpha, "
          "activation_max, attention_logit_p99, or a usual alias of one (train_loss, "
          "learning_rate, ...)"));
    }
    if (!taken.insert(s).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--pattern: ", core::SignalName(s), " is named twice"));
    }
    p->signal_groups_.emplace_back(s, group);
  }
  std::vector<std::string> missing;
  if (p->step_group_ == 0) missing.push_back("step");
  if (taken.count(Signal::kLoss) == 0) missing.push_back("loss");
  if (!missing.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pattern \"", text, "\" has no ", absl::StrJoin(missing, " and no "),
        regex ? " group: name it (?<step>...), (?<loss>...)" : " field: write {step}, {loss}"));
  }
  return std::shared_ptr<const LinePattern>(std::move(p));
}

class PatternParser : public LineParser {
 public:
  PatternParser(std::shared_ptr<const LinePattern> p, absl::string_view source)
      : p_(std::move(p)), source_(source) {}

  absl::Status Line(absl::string_view line, int n, TraceBuilder& b) override {
    if (!p_->re_.Search(line, &captures_)) return absl::OkStatus();
    auto column = [&](absl::string_view v) { return static_cast<int>(v.data() - line.data()) + 1; };
    const absl::string_view step_text = captures_[static_cast<size_t>(p_->step_group_)];
    int64_t step;
    if (!ParseInt64(step_text, &step) || step < 0) {
      return At(source_, n, step_text.data() ? column(step_text) : 1,
                absl::StrCat("step \"", step_text, "\" is not a non-negative integer"));
    }
    TraceBuilder::Row& row = b.NewRow(n);
    if (absl::Status s = b.SetStep(row, step, column(step_text)); !s.ok()) return s;
    for (const auto& [signal, group] : p_->signal_groups_) {
      const absl::string_view v = captures_[static_cast<size_t>(group)];
      if (v.data() == nullptr || v.empty()) continue;  // the group took no part: unknown
      double x;
      if (!ParseDouble(v, &x)) {
        return At(source_, n, column(v),
                  absl::StrCat(core::SignalName(signal), " \"", v, "\" is not a number"));
      }
      b.SetValue(row, signal, x);
    }
    return absl::OkStatus();
  }

  absl::Status End(const TraceBuilder& b) override {
    if (b.rows() > 0) return absl::OkStatus();
    return At(source_, 1, 1,
              absl::StrCat("no line matches --pattern \"", p_->text(), "\": nothing to replay"));
  }

 private:
  std::shared_ptr<const LinePattern> p_;
  absl::string_view source_;
  std::vector<absl::string_view> captures_;
};

std::unique_ptr<LineParser> NewPatternParser(std::shared_ptr<const LinePattern> pattern,
                                             absl::string_view source) {
  return std::make_unique<PatternParser>(std::move(pattern), source);
}

}  // namespace trainwatch::logs
