#include "command.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace trainwatch::cli {

namespace {

bool IsGlobalOption(const std::string& arg) {
  return std::find_if(std::begin(kGlobalOptions), std::end(kGlobalOptions),
                      [&](const char* o) { return arg == o; }) != std::end(kGlobalOptions);
}

// "--points N", "--open".
std::string FlagText(const Flag& f) {
  return f.value.empty() ? absl::StrCat("--", f.name) : absl::StrCat("--", f.name, " ", f.value);
}

}  // namespace

std::string Args::Get(const std::string& flag, const std::string& fallback) const {
  auto it = flags.find(flag);
  return it == flags.end() ? fallback : it->second;
}

absl::StatusOr<int64_t> Args::GetInt(const std::string& flag, int64_t fallback, int64_t min,
                                     int64_t max) const {
  auto it = flags.find(flag);
  if (it == flags.end()) return fallback;
  int64_t v;
  if (!absl::SimpleAtoi(it->second, &v) || v < min || v > max) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " must be a whole number from ", min,
                                                   " to ", max, ", not \"", it->second, "\""));
  }
  return v;
}

void Context::Stream(const std::string& line) const {
  if (emit) {
    emit(line);
  } else {
    *out += line;
  }
}

Command::Command(CommandSpec spec) : spec_(std::move(spec)) {}

std::string Command::Usage() const {
  std::string line = absl::StrCat("usage: twctl ", spec_.name);
  // Continuation lines start under the first operand.
  const std::string indent(line.size() + 1, ' ');
  std::string text;
  auto add = [&](const std::string& word) {
    if (line.size() + 1 + word.size() > 80 && line.size() > indent.size()) {
      absl::StrAppend(&text, line, "\n");
      line = indent.substr(0, indent.size() - 1);
    }
    absl::StrAppend(&line, " ", word);
  };
  if (!spec_.operands.empty()) add(spec_.operands);
  for (const Flag& f : spec_.flags) {
    add(f.required ? FlagText(f) : absl::StrCat("[", FlagText(f), "]"));
  }
  return absl::StrCat(text, line, "\n");
}

std::string Command::Help() const {
  std::string h = absl::StrCat(Usage(), spec_.summary, "\n");
  std::vector<std::string> names;
  size_t width = 0;
  for (const Flag& f : spec_.flags) {
    names.push_back(FlagText(f));
    width = std::max(width, names.back().size());
  }
  for (size_t i = 0; i < names.size(); ++i) {
    absl::StrAppendFormat(&h, "  %-*s  %s\n", static_cast<int>(width), names[i],
                          spec_.flags[i].help);
  }
  h += spec_.notes;
  if (spec_.connects) {
    h += "Connection and output (also before the command): --server ADDR, --token TOKEN,\n"
         "--ca-file PEM, --cert PEM --key PEM, -o table|json; see 'twctl help'.\n";
  }
  return h;
}

int Command::Run(const Args& args, Context& ctx) const {
  const std::string& named = spec_.operands;
  if (!spec_.raw_arguments && !named.empty() && named.find('[') == std::string::npos) {
    const size_t count = static_cast<size_t>(std::count(named.begin(), named.end(), ' ')) + 1;
    if (args.operands.size() != count) {
      *ctx.err = Misuse();
      return kUsage;
    }
  }
  return Execute(args, ctx);
}

std::string Command::Misuse() const { return spec_.misuse.empty() ? Usage() : spec_.misuse; }

absl::StatusOr<Args> Command::Parse(const std::vector<std::string>& argv,
                                    size_t skip_operands) const {
  Args a;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    auto operand = [&] {
      if (skip_operands > 0) {
        --skip_operands;
      } else {
        a.operands.push_back(arg);
      }
    };
    if (spec_.raw_arguments) {
      operand();
      continue;
    }
    if (arg == "--help" || arg == "-h") {
      a.help = true;
      return a;
    }
    // --server ADDR, --server=ADDR, -o json, -o=json.
    std::string name = arg;
    std::optional<std::string> inline_value;
    if (const size_t eq = arg.find('=');
        eq != std::string::npos && IsGlobalOption(arg.substr(0, eq))) {
      name = arg.substr(0, eq);
      inline_value = arg.substr(eq + 1);
    }
    if (IsGlobalOption(name)) {
      if (!inline_value && i + 1 >= argv.size()) {
        return absl::InvalidArgumentError(absl::StrCat("twctl: ", name, " needs a value\n"));
      }
      const std::string v = inline_value ? *inline_value : argv[++i];
      if (name == "-o" || name == "--output") a.output = v;
      if (name == "--server") a.server = v;
      if (name == "--token") a.token = v;
      if (name == "--ca-file") a.ca_file = v;
      if (name == "--cert") a.cert_file = v;
      if (name == "--key") a.key_file = v;
      continue;
    }
    if (arg.rfind("--", 0) != 0) {
      operand();
      continue;
    }
    name = arg.substr(2);
    const size_t eq = name.find('=');
    if (eq != std::string::npos) {
      inline_value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    auto flag = std::find_if(spec_.flags.begin(), spec_.flags.end(),
                             [&](const Flag& f) { return f.name == name; });
    if (flag == spec_.flags.end()) {
      return absl::InvalidArgumentError(absl::StrCat("twctl: unknown flag --", name, "\n", Help()));
    }
    std::string value;
    if (flag->value.empty()) {
      // A switch: given is on, whatever follows an '='.
    } else if (inline_value) {
      value = *inline_value;
    } else if (i + 1 < argv.size()) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("twctl: --", name, " needs a value\n"));
    }
    a.flags[name] = value;
    a.all_values[name].push_back(value);
  }
  if (!spec_.raw_arguments && a.output != "table" && a.output != "json") {
    return absl::InvalidArgumentError("twctl: -o must be table or json\n");
  }
  return a;
}

}  // namespace trainwatch::cli
