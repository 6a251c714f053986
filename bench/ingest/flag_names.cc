#include "flag_names.h"

#include <algorithm>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/string_view.h"

namespace trainwatch::bench {

std::vector<std::string> NormalizeFlagNames(int argc, char** argv) {
  std::vector<std::string> out(argv, argv + argc);
  for (size_t i = 1; i < out.size(); ++i) {
    std::string& arg = out[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    const size_t dashes = arg.compare(0, 2, "--") == 0 ? 2 : 1;
    const size_t eq = arg.find('=');
    const size_t name_end = eq == std::string::npos ? arg.size() : eq;
    std::string name = arg.substr(dashes, name_end - dashes);
    std::replace(name.begin(), name.end(), '-', '_');
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) continue;
    arg.replace(dashes, name_end - dashes, name);
    // "--flag value": the value is not a flag, whatever it looks like.
    if (eq == std::string::npos && !flag->IsOfType<bool>()) ++i;
  }
  return out;
}

std::vector<char*> ArgvOf(std::vector<std::string>& args) {
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  return argv;
}

}  // namespace trainwatch::bench
