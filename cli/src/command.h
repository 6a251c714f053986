// The base of every twctl command (dcgmi's shape): a command is its name,
// a one-line summary, its own flags and a Run(); the base parses the
// arguments against those flags and writes the usage and --help text from
// them, so neither is written by hand anywhere else.

#ifndef TRAINWATCH_CLI_SRC_COMMAND_H_
#define TRAINWATCH_CLI_SRC_COMMAND_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "trainwatch/cli/operator_commands.h"

namespace trainwatch::cli {

class OperatorClient;

// twctl's exit codes (documented in the top-level usage).
inline constexpr int kOk = 0, kError = 1, kUsage = 2, kRefused = 3;

// The options any command accepts, before or after its name (SplitCommandLine
// moves them after): the connection and the output form. Each takes a value.
inline constexpr const char* kGlobalOptions[] = {"-o",        "--output", "--server", "--token",
                                                 "--ca-file", "--cert",   "--key"};

// A flag a command declares.
struct Flag {
  // `required` only shows the flag unbracketed in the usage; the command
  // itself checks it, with its own message.
  Flag(std::string name, std::string value, std::string help, bool required = false)
      : name(std::move(name)), value(std::move(value)), help(std::move(help)), required(required) {}

  std::string name;   // without the dashes: "points"
  std::string value;  // what the usage calls its value ("N"); empty for a switch
  std::string help;   // one line for --help
  bool required;
};

// What a command is: the text of its usage and help, and what it parses.
struct CommandSpec {
  CommandSpec(std::string name, std::string operands, std::string summary,
              std::vector<Flag> flags = {})
      : name(std::move(name)),
        operands(std::move(operands)),
        summary(std::move(summary)),
        flags(std::move(flags)) {}
  // Talks to trainwatchd: Context::client is set.
  CommandSpec Connecting() && {
    connects = true;
    return std::move(*this);
  }
  // Hands every argument to Run as an operand, unparsed (replay parses its
  // own; its help comes from it too).
  CommandSpec RawArguments() && {
    raw_arguments = true;
    return std::move(*this);
  }
  // Lines printed after the flags in --help, for what a flag's one line
  // cannot hold (a value's syntax); each line at most 80 columns.
  CommandSpec WithNotes(std::string text) && {
    notes = std::move(text);
    return std::move(*this);
  }
  // What is printed when the operands are wrong; Usage() unless set.
  CommandSpec WithMisuse(std::string text) && {
    misuse = std::move(text);
    return std::move(*this);
  }

  std::string name;  // "status", or "rollback approve" for a subcommand
  // "RUN", "ID": required, counted; "" or "[COMMAND]": any number.
  std::string operands;
  std::string summary;  // one line, for the command list and --help
  std::vector<Flag> flags;
  std::string notes;  // "" or lines ending in '\n'
  bool connects = false;
  bool raw_arguments = false;
  std::string misuse;
};

// A command line parsed against a CommandSpec.
struct Args {
  std::vector<std::string> operands;
  std::map<std::string, std::string> flags;  // those given, the last value; "" for switches
  // Every value of each flag given, in order: what a repeatable flag
  // (--precision A=fp32 --precision B=fp32) reads through GetAll.
  std::map<std::string, std::vector<std::string>> all_values;
  std::string server, token, ca_file, cert_file, key_file, output = "table";
  bool help = false;  // --help or -h: nothing else was parsed

  bool Has(const std::string& flag) const { return flags.count(flag) > 0; }
  // The flag's value, `fallback` when not given.
  std::string Get(const std::string& flag, const std::string& fallback = "") const;
  // Every value the flag was given, in order; empty when not given.
  std::vector<std::string> GetAll(const std::string& flag) const {
    auto it = all_values.find(flag);
    return it == all_values.end() ? std::vector<std::string>() : it->second;
  }
  // The flag's value as a whole number in [min, max], `fallback` when not
  // given; else InvalidArgument "--points must be a whole number from 1 to
  // 100000, not -3", for the command to print as a usage error.
  absl::StatusOr<int64_t> GetInt(const std::string& flag, int64_t fallback, int64_t min,
                                 int64_t max) const;
};

// What a command runs against; tests fill it with a fake client.
struct Context {
  OperatorClient* client = nullptr;  // set for commands whose spec connects
  Prompt prompt;
  Emit emit;
  std::string* out = nullptr;
  std::string* err = nullptr;

  // A streamed line: to emit when set, else appended to *out.
  void Stream(const std::string& line) const;
};

class Command {
 public:
  explicit Command(CommandSpec spec);
  virtual ~Command() = default;
  Command(const Command&) = delete;
  Command& operator=(const Command&) = delete;

  const CommandSpec& spec() const { return spec_; }
  const std::string& name() const { return spec_.name; }
  // "usage: twctl status RUN [--points N]\n", wrapped past 80 columns.
  std::string Usage() const;
  // What `twctl help NAME` and `NAME --help` print.
  virtual std::string Help() const;
  // The spec's misuse line (see there), ending in a newline.
  std::string Misuse() const;

  // `argv` is everything after the command's name. `skip_operands` drops the
  // first operands (a subcommand's name, which its group read). A usage error
  // is InvalidArgument with the whole message.
  absl::StatusOr<Args> Parse(const std::vector<std::string>& argv, size_t skip_operands = 0) const;

  // Runs the parsed command; returns the exit code. Output and errors go to
  // *ctx.out and *ctx.err. Operands named in the spec ("RUN", "ID") must all
  // be there, and no more: else the misuse line and kUsage, before Execute.
  int Run(const Args& args, Context& ctx) const;

 protected:
  // The command itself, its operands checked.
  virtual int Execute(const Args& args, Context& ctx) const = 0;

 private:
  CommandSpec spec_;
};

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLI_SRC_COMMAND_H_
