// twctl: the operator's command line. Its commands, their dispatch and the
// terminal's I/O are the library's (operator_commands.h), which the Python
// module also runs for the wheel's `twctl`.

#include <string>
#include <vector>

#include "trainwatch/cli/operator_commands.h"

int main(int argc, char** argv) {
  return trainwatch::cli::TwctlMain(std::vector<std::string>(argv + 1, argv + argc));
}
