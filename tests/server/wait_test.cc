// The shared waiting helpers: WaitUntil returns as soon as its condition
// holds, HoldsFor as soon as its condition breaks.

#include <chrono>

#include <catch2/catch.hpp>

#include "testing/wait.h"

namespace trainwatch::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;

TEST_CASE("wait: WaitUntil returns once the condition holds and gives up at its timeout",
          "[testing][wait]") {
  int calls = 0;
  const auto start = steady_clock::now();
  CHECK(WaitUntil([&] { return ++calls == 3; }, seconds(20)));
  CHECK(calls == 3);
  CHECK(steady_clock::now() - start < seconds(10));
  const auto give_up = steady_clock::now();
  CHECK_FALSE(WaitUntil([] { return false; }, milliseconds(50), milliseconds(10)));
  CHECK(steady_clock::now() - give_up >= milliseconds(50));
}

TEST_CASE("wait: HoldsFor holds for its whole period and fails as soon as the condition breaks",
          "[testing][wait]") {
  int calls = 0;
  const auto start = steady_clock::now();
  CHECK(HoldsFor([&] { return ++calls > 0; }, milliseconds(30)));
  CHECK(steady_clock::now() - start >= milliseconds(30));
  CHECK(calls > 1);  // checked throughout, not once
  calls = 0;
  const auto broken = steady_clock::now();
  CHECK_FALSE(HoldsFor([&] { return ++calls < 3; }, seconds(20)));
  CHECK(calls == 3);
  CHECK(steady_clock::now() - broken < seconds(10));
}

}  // namespace
}  // namespace trainwatch::testing
