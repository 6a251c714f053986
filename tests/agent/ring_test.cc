// The ring between the training thread and the pump, alone.

#include "ring.h"

#include <thread>
#include <vector>

#include <catch2/catch.hpp>

namespace trainwatch::agent::internal {
namespace {

void Push(Ring<int>& ring, int v) {
  int* slot = ring.BeginPush();
  REQUIRE(slot != nullptr);
  *slot = v;
  ring.EndPush();
}

int Pop(Ring<int>& ring) {
  int* front = ring.Front();
  REQUIRE(front != nullptr);
  const int v = *front;
  ring.Pop();
  return v;
}

TEST_CASE("ring: items come out in the order they went in", "[agent][ring]") {
  Ring<int> ring(4);
  CHECK(ring.Front() == nullptr);
  Push(ring, 1);
  Push(ring, 2);
  Push(ring, 3);
  CHECK(Pop(ring) == 1);
  CHECK(Pop(ring) == 2);
  CHECK(Pop(ring) == 3);
  CHECK(ring.Front() == nullptr);
  CHECK(ring.dropped() == 0);
}

TEST_CASE("ring: the capacity rounds up to a power of two", "[agent][ring]") {
  CHECK(Ring<int>(1).capacity() == 1);
  CHECK(Ring<int>(5).capacity() == 8);
  CHECK(Ring<int>(4096).capacity() == 4096);
}

TEST_CASE("ring: full refuses the newest and counts it", "[agent][ring]") {
  Ring<int> ring(4);
  for (int i = 0; i < 4; ++i) Push(ring, i);
  CHECK(ring.BeginPush() == nullptr);
  CHECK(ring.BeginPush() == nullptr);
  CHECK(ring.dropped() == 2);
  // What was in stays, oldest first; one pop makes room for one more.
  CHECK(Pop(ring) == 0);
  Push(ring, 4);
  CHECK(ring.BeginPush() == nullptr);
  CHECK(ring.dropped() == 3);
  for (int want = 1; want <= 4; ++want) CHECK(Pop(ring) == want);
  CHECK(ring.Front() == nullptr);
}

TEST_CASE("ring: wraps around its slots many times", "[agent][ring]") {
  Ring<int> ring(4);
  int next_in = 0, next_out = 0;
  // Three in flight at a time, so the head and tail cross the end of the
  // slot array at different moments.
  for (int round = 0; round < 100; ++round) {
    while (next_in - next_out < 3) Push(ring, next_in++);
    CHECK(Pop(ring) == next_out++);
  }
  while (ring.Front() != nullptr) CHECK(Pop(ring) == next_out++);
  CHECK(next_out == next_in);
  CHECK(ring.dropped() == 0);
}

TEST_CASE("ring: one producer and one consumer thread lose nothing", "[agent][ring]") {
  constexpr int kItems = 200000;
  Ring<int> ring(64);
  std::vector<int> got;
  got.reserve(kItems);
  std::thread consumer([&] {
    while (static_cast<int>(got.size()) < kItems) {
      if (int* v = ring.Front()) {
        got.push_back(*v);
        ring.Pop();
      }
    }
  });
  for (int i = 0; i < kItems;) {
    if (int* slot = ring.BeginPush()) {
      *slot = i++;
      ring.EndPush();
    }
  }
  consumer.join();
  bool in_order = true;
  for (int i = 0; i < kItems; ++i) in_order = in_order && got[i] == i;
  CHECK(in_order);
}

}  // namespace
}  // namespace trainwatch::agent::internal
