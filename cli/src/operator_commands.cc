#include "trainwatch/cli/operator_commands.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <iostream>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "command.h"
#include "command_output.h"
#include "registry.h"

namespace trainwatch::cli {

std::string Sparkline(const std::vector<double>& values, size_t width) {
  static const char* const kBlocks[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  if (values.empty()) return "";
  // Average into `width` columns.
  const size_t n = std::min(width, values.size());
  std::vector<double> cols(n, 0.0);
  std::vector<int> counts(n, 0);
  for (size_t i = 0; i < values.size(); ++i) {
    const size_t c = i * n / values.size();
    if (std::isfinite(values[i])) {
      cols[c] += values[i];
      ++counts[c];
    }
  }
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (size_t c = 0; c < n; ++c) {
    if (counts[c] == 0) continue;
    cols[c] /= counts[c];
    lo = std::min(lo, cols[c]);
    hi = std::max(hi, cols[c]);
  }
  std::string out;
  for (size_t c = 0; c < n; ++c) {
    if (counts[c] == 0) {
      out += " ";
      continue;
    }
    const int level = hi > lo ? static_cast<int>(std::lround((cols[c] - lo) / (hi - lo) * 7)) : 3;
    out += kBlocks[std::clamp(level, 0, 7)];
  }
  return out;
}

std::string Chart(const std::string& title, const std::vector<std::pair<int64_t, double>>& points,
                  size_t width, size_t height) {
  std::vector<std::pair<int64_t, double>> pts;
  for (const auto& p : points) {
    if (std::isfinite(p.second)) pts.push_back(p);
  }
  if (pts.empty()) return absl::StrCat(title, ": no data\n");
  double lo = pts[0].second, hi = lo;
  for (const auto& p : pts) {
    lo = std::min(lo, p.second);
    hi = std::max(hi, p.second);
  }
  if (hi == lo) hi = lo + 1e-9;
  const int64_t x0 = pts.front().first, x1 = std::max(pts.back().first, x0 + 1);
  std::vector<std::string> grid(height, std::string(width, ' '));
  for (const auto& [x, y] : pts) {
    const size_t col = static_cast<size_t>((x - x0) * static_cast<int64_t>(width - 1) / (x1 - x0));
    const size_t row = static_cast<size_t>(std::lround((hi - y) / (hi - lo) * (height - 1)));
    grid[std::min(row, height - 1)][std::min(col, width - 1)] = '*';
  }
  std::string out = absl::StrCat(title, "\n");
  for (size_t r = 0; r < height; ++r) {
    const double label = hi - (hi - lo) * static_cast<double>(r) / static_cast<double>(height - 1);
    absl::StrAppendFormat(&out, "%10s |%s\n", Fmt(label), grid[r]);
  }
  absl::StrAppendFormat(&out, "%10s +%s\n%11s %-*d%d\n", "", std::string(width, '-'), "",
                        static_cast<int>(width - 8), x0, x1);
  return out;
}

bool SplitCommandLine(const std::vector<std::string>& argv, std::string* command,
                      std::vector<std::string>* args, std::string* err) {
  std::vector<std::string> global;
  size_t i = 0;
  for (; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    bool known = false, takes_value = false;
    for (const char* name : kGlobalOptions) {
      if (a == name) known = takes_value = true;
      if (a.rfind(std::string(name) + "=", 0) == 0) known = true;
    }
    if (!known) break;
    global.push_back(a);
    if (takes_value) {
      if (i + 1 >= argv.size()) {
        *err = absl::StrCat("twctl: ", a, " needs a value\n");
        return false;
      }
      global.push_back(argv[++i]);
    }
  }
  if (i >= argv.size()) {
    *err = "twctl: no command given\n";
    return false;
  }
  *command = argv[i];
  args->assign(argv.begin() + static_cast<std::ptrdiff_t>(i) + 1, argv.end());
  args->insert(args->end(), global.begin(), global.end());
  return true;
}

int OperatorCommand(const std::string& command, const std::vector<std::string>& args,
                    const Prompt& prompt, std::string* out, std::string* err, const Emit& emit) {
  Context ctx;
  ctx.prompt = prompt;
  ctx.emit = emit;
  ctx.out = out;
  ctx.err = err;
  return Registry().Dispatch(command, args, ctx);
}

std::string TwctlUsage() { return Registry().Usage(); }

namespace {

int RunOnTerminal(const std::vector<std::string>& argv) {
  std::string command, err;
  std::vector<std::string> args;
  if (!SplitCommandLine(argv, &command, &args, &err)) {
    std::fputs((err + TwctlUsage()).c_str(), stderr);
    return 2;
  }
  std::string out;
  const int code = OperatorCommand(
      command, args,
      [](const std::string& question) {
        std::fputs(question.c_str(), stderr);
        std::string answer;
        if (!std::getline(std::cin, answer)) return false;
        return answer == "y" || answer == "Y" || answer == "yes";
      },
      &out, &err,
      [](const std::string& line) {
        std::fwrite(line.data(), 1, line.size(), stdout);
        std::fflush(stdout);
      });
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fwrite(err.data(), 1, err.size(), stderr);
  return code;
}

}  // namespace

int TwctlMain(const std::vector<std::string>& argv) {
  // Nothing below should throw; if a library does, say so in one line
  // rather than abort with a core dump.
  int code = 1;
  try {
    code = RunOnTerminal(argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "twctl: unexpected error: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "twctl: unexpected error\n");
  }
  std::fflush(stdout);
  std::fflush(stderr);
  return code;
}

}  // namespace trainwatch::cli
