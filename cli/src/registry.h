// The one list of twctl's commands: it writes the top-level usage, answers
// `twctl help [CMD]` and `CMD --help`, and dispatches a command line.

#ifndef TRAINWATCH_CLI_SRC_REGISTRY_H_
#define TRAINWATCH_CLI_SRC_REGISTRY_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "command.h"
#include "operator_client.h"

namespace trainwatch::cli {

// How a command that connects gets its client (tests give a fake); an error
// (a bad config or TLS file) ends the command before any call, exit 2.
using Dialer =
    std::function<absl::StatusOr<std::unique_ptr<OperatorClient>>(const Connection&)>;

class CommandRegistry {
 public:
  // Every command, in the order the usage lists them.
  CommandRegistry();
  CommandRegistry(const CommandRegistry&) = delete;
  CommandRegistry& operator=(const CommandRegistry&) = delete;

  // What `twctl help` prints.
  std::string Usage() const;
  // The command of this name ("status", "rollback approve"), or a group of
  // subcommands ("rollback"); null for none.
  const Command* Find(const std::string& name) const;
  // `twctl help WORDS...`: the usage, or one command's (or group's) help.
  int Help(const std::vector<std::string>& words, std::string* out, std::string* err) const;

  // Runs `command` (the first word after twctl; for a group, its subcommand
  // is the first operand in `args`). Commands that connect get a client from
  // `dial`, given the connection the flags, environment and config say.
  // All the command prints is passed through TerminalSafe (command_output.h).
  int Dispatch(const std::string& command, const std::vector<std::string>& args, Context& ctx,
               const Dialer& dial = DialOperator) const;

 private:
  // Dispatch without the output filter.
  int Route(const std::string& command, const std::vector<std::string>& args, Context& ctx,
            const Dialer& dial) const;
  int Execute(const Command& c, const std::vector<std::string>& args, size_t skip_operands,
              Context& ctx, const Dialer& dial) const;

  std::vector<std::unique_ptr<Command>> commands_;  // the usage's order
  std::vector<std::unique_ptr<Command>> groups_;    // "incident", "rollback"
};

// The registry twctl runs.
const CommandRegistry& Registry();

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLI_SRC_REGISTRY_H_
