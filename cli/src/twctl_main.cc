// twctl: the operator's command line. main() only dispatches; each command
// is a library function the tests call directly.

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "trainwatch/cli/operator_commands.h"
#include "trainwatch/cli/replay.h"
#include "trainwatch/core/version.h"

namespace {

constexpr char kUsage[] =
    "usage: twctl [--server ADDR] [--token TOKEN] [--ca-file PEM] [-o table|json] COMMAND [ARGS]\n"
    "commands:\n"
    "  runs | status RUN | incidents | incident show ID | shards RUN\n"
    "  report RUN [--out FILE]  the run as one HTML page (charts, incidents, shards)\n"
    "  watch [--run RUN] [--open]  incident changes as they happen (Ctrl-C ends)\n"
    "  rollback approve ID [--to-step N] [--quarantine-shards A..B] [--z-loss-alpha X]\n"
    "                      [--skip-steps A..B|none]\n"
    "                      [--comment TEXT] [--yes] [--dry-run]\n"
    "  rollback reject ID --comment TEXT\n"
    "  replay FILE   replay exported metrics through the rule engine (backtesting)\n"
    "  help          this text\n"
    "  version       twctl's release\n"
    "Connection: --server/--token, TRAINWATCH_SERVER/TRAINWATCH_TOKEN, or\n"
    "~/.config/trainwatch/twctl.json; output: -o table|json.\n"
    "Run 'twctl COMMAND --help' for a command's flags.\n"
    "Exit codes: 0 ok, 1 error, 2 usage or malformed input, 3 refused by the server's state.\n";

}  // namespace

int main(int argc, char** argv) {
  std::string command, split_err;
  std::vector<std::string> args;
  if (!trainwatch::cli::SplitCommandLine({argv + 1, argv + argc}, &command, &args, &split_err)) {
    std::fputs((split_err + kUsage).c_str(), stderr);
    return 2;
  }
  std::string out, err;
  int code;
  if (command == "replay") {
    code = trainwatch::cli::ReplayCommand(args, &out, &err);
  } else if (command == "runs" || command == "status" || command == "incidents" ||
             command == "incident" || command == "rollback" || command == "shards" ||
             command == "report" || command == "watch") {
    code = trainwatch::cli::OperatorCommand(
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
  } else if (command == "version" || command == "--version") {
    out = std::string("twctl ") + trainwatch::kVersion + "\n";
    code = 0;
  } else if (command == "help" || command == "--help" || command == "-h") {
    out = kUsage;
    code = 0;
  } else {
    err = "twctl: unknown command '" + command + "'\n" + kUsage;
    code = 2;
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fwrite(err.data(), 1, err.size(), stderr);
  return code;
}
