// Waiting for another thread's (or process's) effect without a fixed sleep:
// polls the predicate until it holds or the (real) timeout passes.

#ifndef TRAINWATCH_TESTS_TESTING_WAIT_H_
#define TRAINWATCH_TESTS_TESTING_WAIT_H_

#include <chrono>
#include <thread>

namespace trainwatch::testing {

// True as soon as `predicate()` is; false if it never was within `timeout`.
// A costly predicate (one that starts a process) takes a longer `interval`.
template <typename Predicate>
bool WaitUntil(Predicate predicate, std::chrono::milliseconds timeout,
               std::chrono::milliseconds interval = std::chrono::milliseconds(5)) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!predicate()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(interval);
  }
  return true;
}

// True if `predicate()` held throughout `duration`; false as soon as it does
// not. The one legitimate fixed wait: that something does NOT happen can
// only be observed for a while, so keep `duration` short and say in the
// test what it would have caught.
template <typename Predicate>
bool HoldsFor(Predicate predicate, std::chrono::milliseconds duration) {
  return !WaitUntil([&] { return !predicate(); }, duration) && predicate();
}

}  // namespace trainwatch::testing

#endif  // TRAINWATCH_TESTS_TESTING_WAIT_H_
