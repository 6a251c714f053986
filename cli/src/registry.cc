#include "registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "command_output.h"
#include "commands.h"

namespace trainwatch::cli {

namespace {

const Command* FindIn(const std::vector<std::unique_ptr<Command>>& list, const std::string& name) {
  auto it = std::find_if(list.begin(), list.end(),
                         [&](const std::unique_ptr<Command>& c) { return c->name() == name; });
  return it == list.end() ? nullptr : it->get();
}

class HelpCommand : public Command {
 public:
  explicit HelpCommand(const CommandRegistry& registry)
      : Command(CommandSpec("help", "[COMMAND]", "this text, or a command's flags")),
        registry_(registry) {}

  int Execute(const Args& args, Context& ctx) const override {
    return registry_.Help(args.operands, ctx.out, ctx.err);
  }

 private:
  const CommandRegistry& registry_;
};

// The first word of subcommands ("rollback" of "rollback approve" and
// "rollback reject"). It parses with every subcommand's flags only to find
// the subcommand's name, which may come after flags; the subcommand then
// parses the same arguments with its own.
class GroupCommand : public Command {
 public:
  GroupCommand(const std::string& name, std::vector<const Command*> subcommands)
      : Command(Spec(name, subcommands)), subcommands_(std::move(subcommands)) {}

  std::string Help() const override {
    std::vector<std::string> parts;
    for (const Command* c : subcommands_) parts.push_back(c->Help());
    return absl::StrJoin(parts, "\n");
  }

  // Reached only without a known subcommand.
  int Execute(const Args&, Context& ctx) const override {
    *ctx.err = Misuse();
    return kUsage;
  }

 private:
  static CommandSpec Spec(const std::string& name, const std::vector<const Command*>& subs) {
    CommandSpec s(name, "", "");
    for (const Command* c : subs) {
      for (const Flag& f : c->spec().flags) {
        const bool known = std::any_of(s.flags.begin(), s.flags.end(),
                                       [&](const Flag& g) { return g.name == f.name; });
        if (!known) s.flags.push_back(f);
      }
    }
    // Subcommands of one group share their misuse line.
    s.misuse = subs.front()->Misuse();
    return s;
  }

  std::vector<const Command*> subcommands_;
};

}  // namespace

CommandRegistry::CommandRegistry() {
  commands_.push_back(MakeRunsCommand());
  commands_.push_back(MakeStatusCommand());
  commands_.push_back(MakeIncidentsCommand());
  commands_.push_back(MakeIncidentShowCommand());
  commands_.push_back(MakeRollbackApproveCommand());
  commands_.push_back(MakeRollbackRejectCommand());
  commands_.push_back(MakeShardsCommand());
  commands_.push_back(MakeReportCommand());
  commands_.push_back(MakeWatchCommand());
  commands_.push_back(MakeReplayCommand());
  commands_.push_back(MakeFollowCommand());
  commands_.push_back(MakeVersionCommand());
  commands_.push_back(std::make_unique<HelpCommand>(*this));
  // A group for each first word that names no command of its own.
  for (const auto& c : commands_) {
    const size_t space = c->name().find(' ');
    if (space == std::string::npos) continue;
    const std::string group = c->name().substr(0, space);
    if (FindIn(groups_, group) != nullptr) continue;
    std::vector<const Command*> subs;
    for (const auto& d : commands_) {
      if (d->name().rfind(group + " ", 0) == 0) subs.push_back(d.get());
    }
    groups_.push_back(std::make_unique<GroupCommand>(group, std::move(subs)));
  }
}

std::string CommandRegistry::Usage() const {
  std::string u =
      "usage: twctl [--server ADDR] [--token TOKEN] [--ca-file PEM] [--cert PEM --key PEM]\n"
      "             [-o table|json] COMMAND [ARGS]\ncommands:\n";
  for (const auto& c : commands_) {
    const std::string& operands = c->spec().operands;
    absl::StrAppendFormat(&u, "  %-22s %s\n",
                          absl::StrCat(c->name(), operands.empty() ? "" : " ", operands),
                          c->spec().summary);
  }
  u += "--server: host:port, or several replicas' host:port,host:port: each call tries them\n"
       "in order, skipping one that is unavailable.\n"
       "--ca-file: TLS, trusting the server by this CA; --cert and --key (together): mutual\n"
       "TLS, for a trainwatchd started with --tls_client_ca. Each setting: the flag, else\n"
       "TRAINWATCH_SERVER / _TOKEN / _CA_FILE / _CERT_FILE / _KEY_FILE, else $TWCTL_CONFIG or\n"
       "~/.config/trainwatch/twctl.json ({\"server\", \"token\", \"ca_file\", \"cert_file\",\n"
       "\"key_file\"}: strings; any other key is an error).\n"
       "Run 'twctl help COMMAND' or 'twctl COMMAND --help' for a command's flags.\n"
       "Exit codes: 0 ok, 1 error, 2 usage or malformed input, 3 refused by the server's "
       "state.\n";
  return u;
}

const Command* CommandRegistry::Find(const std::string& name) const {
  const Command* c = FindIn(commands_, name);
  return c != nullptr ? c : FindIn(groups_, name);
}

int CommandRegistry::Help(const std::vector<std::string>& words, std::string* out,
                          std::string* err) const {
  if (words.empty()) {
    *out = Usage();
    return kOk;
  }
  const std::string name = absl::StrJoin(words, " ");
  const Command* c = Find(name);
  if (c == nullptr) {
    *err = absl::StrCat("twctl: unknown command '", name, "'\n", Usage());
    return kUsage;
  }
  *out = c->Help();
  return kOk;
}

int CommandRegistry::Dispatch(const std::string& command, const std::vector<std::string>& args,
                              Context& ctx, const Dialer& dial) const {
  // Everything a command prints passes TerminalSafe, here and nowhere else:
  // its stdout and stderr text, each streamed line, each question.
  Context filtered = ctx;
  std::string out = *ctx.out, err = *ctx.err;
  filtered.out = &out;
  filtered.err = &err;
  if (ctx.emit) filtered.emit = [&ctx](const std::string& l) { ctx.emit(TerminalSafe(l)); };
  if (ctx.prompt) {
    filtered.prompt = [&ctx](const std::string& q) { return ctx.prompt(TerminalSafe(q)); };
  }
  const int code = Route(command, args, filtered, dial);
  *ctx.out = TerminalSafe(out);
  *ctx.err = TerminalSafe(err);
  return code;
}

int CommandRegistry::Route(const std::string& command, const std::vector<std::string>& args,
                           Context& ctx, const Dialer& dial) const {
  std::string name = command;
  if (name == "--help" || name == "-h") name = "help";
  if (name == "--version") name = "version";
  if (const Command* group = FindIn(groups_, name)) {
    absl::StatusOr<Args> a = group->Parse(args);
    if (a.ok() && !a->operands.empty()) {
      if (const Command* sub = FindIn(commands_, absl::StrCat(name, " ", a->operands[0]))) {
        return Execute(*sub, args, /*skip_operands=*/1, ctx, dial);
      }
    }
    return Execute(*group, args, 0, ctx, dial);  // its parse error, its help, or its misuse
  }
  if (const Command* c = FindIn(commands_, name)) return Execute(*c, args, 0, ctx, dial);
  *ctx.err = absl::StrCat("twctl: unknown command '", command, "'\n", Usage());
  return kUsage;
}

int CommandRegistry::Execute(const Command& c, const std::vector<std::string>& args,
                             size_t skip_operands, Context& ctx, const Dialer& dial) const {
  absl::StatusOr<Args> a = c.Parse(args, skip_operands);
  if (!a.ok()) {
    *ctx.err = std::string(a.status().message());
    return kUsage;
  }
  if (a->help) {
    *ctx.out = c.Help();
    return kOk;
  }
  if (!c.spec().connects) return c.Run(*a, ctx);
  absl::StatusOr<std::unique_ptr<OperatorClient>> client = dial(
      ResolveConnection({a->server, a->token, a->ca_file, a->cert_file, a->key_file}));
  if (!client.ok()) {
    *ctx.err = absl::StrCat("twctl: ", client.status().message(), "\n");
    return kUsage;
  }
  Context connected = ctx;
  connected.client = client->get();
  return c.Run(*a, connected);
}

const CommandRegistry& Registry() {
  static const CommandRegistry* const registry = new CommandRegistry();
  return *registry;
}

}  // namespace trainwatch::cli
