// Waiting for another thread's effect without a fixed sleep: polls the
// predicate until it holds or the (real) timeout passes.

#ifndef TRAINWATCH_TESTS_TESTING_WAIT_H_
#define TRAINWATCH_TESTS_TESTING_WAIT_H_

#include <chrono>
#include <thread>

namespace trainwatch::testing {

// True as soon as `predicate()` is; false if it never was within `timeout`.
template <typename Predicate>
bool WaitUntil(Predicate predicate, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!predicate()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace trainwatch::testing

#endif  // TRAINWATCH_TESTS_TESTING_WAIT_H_
