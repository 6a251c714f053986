// trainwatchd given a directory where a file belongs: a clear error naming
// the path and exit status 2 (a bad flag), not an uncaught exception's abort.

#include <sys/stat.h>

#include <string>

#include <catch2/catch.hpp>

#include "test_util.h"

namespace trainwatch::testing {
namespace {

// Runs trainwatchd with `flags` on a throwaway database and free ports.
int RunTrainwatchd(const TempDir& dir, const std::string& flags, std::string* output) {
  return RunCommand(std::string(TRAINWATCHD_PATH) + " --listen 127.0.0.1:0 --metrics_listen '' --db " +
                        dir.File("tw.db") + " " + flags,
                    "", output);
}

TEST_CASE("trainwatchd: a directory for a file flag is an error naming it", "[server][files]") {
  TempDir dir;
  const std::string folder = dir.File("folder");
  REQUIRE(::mkdir(folder.c_str(), 0755) == 0);
  std::string out;

  CHECK(RunTrainwatchd(dir, "--tokens " + folder, &out) == 2);
  CHECK(out == "trainwatchd: tokens file: cannot read " + folder + ": it is a directory\n");

  CHECK(RunTrainwatchd(dir, "--tls_cert " + folder + " --tls_key " + folder, &out) == 2);
  CHECK(out == "trainwatchd: cannot read " + folder + ": it is a directory\n");

  CHECK(RunTrainwatchd(dir, "--rules " + folder, &out) == 2);
  CHECK(out == "trainwatchd: cannot read " + folder + ": it is a directory\n");

  CHECK(RunTrainwatchd(dir, "--pager_config " + folder, &out) == 2);
  CHECK(out == "trainwatchd: pager config: cannot read " + folder + ": it is a directory\n");
}

TEST_CASE("trainwatchd: a missing tokens file is an error naming it", "[server][files]") {
  TempDir dir;
  std::string out;
  CHECK(RunTrainwatchd(dir, "--tokens " + dir.File("none.json"), &out) == 2);
  CHECK(out == "trainwatchd: tokens file: cannot read " + dir.File("none.json") +
                   ": No such file or directory\n");
}

}  // namespace
}  // namespace trainwatch::testing
