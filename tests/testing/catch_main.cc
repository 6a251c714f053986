// Catch2's main() and its runner, compiled once for every test binary
// (cmake/TrainwatchCatchMain.cmake makes it part of Catch2::Catch2). The
// runner is the costliest file of any test binary to compile (about 45
// CPU-seconds at -O2 -g here), so no test file defines CATCH_CONFIG_MAIN.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
