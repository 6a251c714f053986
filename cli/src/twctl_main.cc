// twctl: the operator's command line. main() only does the terminal's I/O;
// the commands and their dispatch are the library's (operator_commands.h).

#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "trainwatch/cli/operator_commands.h"

namespace {

int Run(int argc, char** argv) {
  std::string command, err;
  std::vector<std::string> args;
  if (!trainwatch::cli::SplitCommandLine({argv + 1, argv + argc}, &command, &args, &err)) {
    std::fputs((err + trainwatch::cli::TwctlUsage()).c_str(), stderr);
    return 2;
  }
  std::string out;
  const int code = trainwatch::cli::OperatorCommand(
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

int main(int argc, char** argv) {
  // Nothing below should throw; if a library does, say so in one line
  // rather than abort with a core dump.
  try {
    return Run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "twctl: unexpected error: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "twctl: unexpected error\n");
  }
  return 1;
}
