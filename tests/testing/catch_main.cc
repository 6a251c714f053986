// Catch2's main() and its runner, compiled once for every test binary
// (trainwatch::catch_main, cmake/TrainwatchCatchMain.cmake). The runner is
// the costliest file of any test binary to compile (about 48 CPU-seconds at
// -O2 -g here), so no test file defines CATCH_CONFIG_MAIN itself.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
