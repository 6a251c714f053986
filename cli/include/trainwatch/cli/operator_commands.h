// twctl's commands as a library: the entry point main() and the tests call,
// and the terminal charts the commands draw. Each command is a class of its
// own in cli/src (command.h, commands.h); `twctl help` lists them.
//
// Connection, as kubectl and amtool users expect: the --server, --token,
// --ca-file, --cert and --key flags, else TRAINWATCH_SERVER, _TOKEN,
// _CA_FILE, _CERT_FILE and _KEY_FILE, else the config file ($TWCTL_CONFIG
// or ~/.config/trainwatch/twctl.json: {"server", "token", "ca_file",
// "cert_file", "key_file"}, strings; a malformed file is an error naming it),
// else 127.0.0.1:7070. --cert and --key (mutual TLS) go together. Output:
// -o table (default) or -o json (one JSON object: the API response in the
// proto3 JSON mapping of its trainwatch.v1 message). Everything printed has
// its control characters escaped (TerminalSafe). Errors go to stderr. Exit
// codes: 0 ok, 1 error, 2 usage (also a malformed config file or a TLS file
// that cannot be read, before connecting), 3 refused by the server's state
// (FAILED_PRECONDITION).

#ifndef TRAINWATCH_CLI_OPERATOR_COMMANDS_H_
#define TRAINWATCH_CLI_OPERATOR_COMMANDS_H_

#include <functional>
#include <string>
#include <vector>

namespace trainwatch::cli {

// How a command asks the human for confirmation (tests answer it).
using Prompt = std::function<bool(const std::string& question)>;

// Where a streaming command (watch) writes each line as it happens; when
// unset, the lines go to *out.
using Emit = std::function<void(const std::string& line)>;

// Runs `command` (the first word after twctl: any command `twctl help`
// lists, or help's and version's --help, -h, --version) with its arguments.
// Returns the exit code; stdout and stderr text go to *out and *err.
int OperatorCommand(const std::string& command, const std::vector<std::string>& args,
                    const Prompt& prompt, std::string* out, std::string* err,
                    const Emit& emit = nullptr);

// Splits twctl's arguments (argv without the program name) into the command
// and its arguments. Connection and output options (--server, --token,
// --ca-file, -o/--output, also as --name=value) may come before the command;
// they are moved after its arguments. False with a message in *err when no
// command is given or an option lacks its value.
bool SplitCommandLine(const std::vector<std::string>& argv, std::string* command,
                      std::vector<std::string>* args, std::string* err);

// What `twctl help` prints: every command, the connection, the exit codes.
std::string TwctlUsage();

// twctl on a terminal: `argv` without the program name; the command's output
// to stdout and stderr (flushed), confirmations asked on stderr and read
// from stdin. Returns the exit code; never throws. The twctl binary's main,
// and the Python module's for the wheel's `twctl` console script.
int TwctlMain(const std::vector<std::string>& argv);

// Unicode sparkline of `values` (NaN shown as a space), at most `width` wide.
std::string Sparkline(const std::vector<double>& values, size_t width = 60);

// A small line chart: `height` rows of text, values scaled between their
// minimum and maximum, with the axis labels on the left.
std::string Chart(const std::string& title, const std::vector<std::pair<int64_t, double>>& points,
                  size_t width = 64, size_t height = 8);

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLI_OPERATOR_COMMANDS_H_
