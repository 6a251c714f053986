// replay and version: the commands that need no server.

#include "absl/strings/str_cat.h"
#include "commands.h"
#include "trainwatch/logs/replay.h"
#include "trainwatch/core/version.h"

namespace trainwatch::cli {
namespace {

// replay parses its own flags and writes its own help (replay.cc); this is
// its entry in the command list.
class ReplayEntry : public Command {
 public:
  ReplayEntry()
      : Command(CommandSpec("replay", "FILE|DIR",
                            "replay exported metrics through the rule engine (backtesting)", {})
                    .RawArguments()) {}

  std::string Help() const override {
    std::string out, err;
    logs::ReplayCommand({"--help"}, &out, &err);
    return out;
  }

  int Execute(const Args& args, Context& ctx) const override {
    return logs::ReplayCommand(args.operands, ctx.out, ctx.err);
  }
};

class VersionCommand : public Command {
 public:
  VersionCommand() : Command(CommandSpec("version", "", "twctl's release")) {}

  int Execute(const Args&, Context& ctx) const override {
    *ctx.out = absl::StrCat("twctl ", kVersion, "\n");
    return kOk;
  }
};

}  // namespace

std::unique_ptr<Command> MakeReplayCommand() { return std::make_unique<ReplayEntry>(); }
std::unique_ptr<Command> MakeVersionCommand() { return std::make_unique<VersionCommand>(); }

}  // namespace trainwatch::cli
