// Every twctl command, one factory each; the classes stay private to their
// files. The registry lists them; a test constructs one alone.

#ifndef TRAINWATCH_CLI_SRC_COMMANDS_H_
#define TRAINWATCH_CLI_SRC_COMMANDS_H_

#include <memory>

#include "command.h"

namespace trainwatch::cli {

// A run's views (run_commands.cc).
std::unique_ptr<Command> MakeRunsCommand();
std::unique_ptr<Command> MakeStatusCommand();
std::unique_ptr<Command> MakeShardsCommand();
std::unique_ptr<Command> MakeReportCommand();

// Incidents (incident_commands.cc).
std::unique_ptr<Command> MakeIncidentsCommand();
std::unique_ptr<Command> MakeIncidentShowCommand();
std::unique_ptr<Command> MakeWatchCommand();

// The approval of a rollback (rollback_commands.cc).
std::unique_ptr<Command> MakeRollbackApproveCommand();
std::unique_ptr<Command> MakeRollbackRejectCommand();

// Those that need no server (local_commands.cc).
std::unique_ptr<Command> MakeReplayCommand();
std::unique_ptr<Command> MakeVersionCommand();

// A running job's log streamed as an observed run (follow.cc).
std::unique_ptr<Command> MakeFollowCommand();

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLI_SRC_COMMANDS_H_
