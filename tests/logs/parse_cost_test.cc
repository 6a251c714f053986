// What reading a metrics file costs, beside what it gives: the number of
// allocations does not grow with the rows (no per-line or per-field
// allocation, the trace sized once), and the fast number path gives the
// double std::from_chars gives, bit for bit. Its own binary, since it
// replaces the global operator new to count.

#include <unistd.h>

#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>
#include <random>
#include <string>

#include <catch2/catch.hpp>

#include "absl/strings/str_format.h"
#include "trainwatch/logs/lines.h"
#include "trainwatch/logs/trace_builder.h"
#include "trainwatch/logs/metrics_file.h"

namespace {
std::atomic<long> g_allocations{0};
}  // namespace

void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace trainwatch::logs {
namespace {

// A W&B-style export whose numbers are written with 17 significant digits
// (Python's repr), so every field is longer than a short string's buffer.
std::string WriteExport(int rows) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            absl::StrFormat("tw_parse_cost_%d_%d.csv", getpid(), rows))
                               .string();
  std::ofstream out(path, std::ios::binary);
  out << "_step,train/loss,train/grad_norm,train/log_z,train/nan_frac\n";
  for (int i = 0; i < rows; ++i) {
    out << absl::StrFormat("%d,%.16e,%.16e,%.16e,0\n", 100000 + i, 3.0 + 1e-3 * (i % 7),
                           1.0 + 1e-4 * (i % 11), 5.0 + 1e-5 * (i % 13));
  }
  return path;
}

long AllocationsToRead(const std::string& path, size_t* rows) {
  const long before = g_allocations.load();
  absl::StatusOr<Trace> t = ReadMetricsFile(path, ReadOptions{});
  const long used = g_allocations.load() - before;
  REQUIRE(t.ok());
  *rows = t->size();
  return used;
}

TEST_CASE("CSV: reading an export allocates the same whatever its length", "[logs][csv][cost]") {
  const std::string small = WriteExport(2000), large = WriteExport(20000);
  size_t small_rows = 0, large_rows = 0;
  const long small_allocs = AllocationsToRead(small, &small_rows);
  const long large_allocs = AllocationsToRead(large, &large_rows);
  CHECK(small_rows == 2000);
  CHECK(large_rows == 20000);
  // 18,000 more rows: no more allocations (a field copied into a string, a
  // row vector doubling, a file read into a growing string would each add
  // thousands or a few).
  CHECK(large_allocs <= small_allocs);
  std::filesystem::remove(small);
  std::filesystem::remove(large);
}

bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

void CheckAgainstFromChars(const std::string& text) {
  double fast = 0.0;
  if (!ParseDecimalFast(text, &fast)) return;  // from_chars's own case
  double slow = 0.0;
  const auto res = std::from_chars(text.data(), text.data() + text.size(), slow);
  INFO(text);
  REQUIRE(res.ec == std::errc());
  REQUIRE(res.ptr == text.data() + text.size());
  REQUIRE(SameBits(fast, slow));
}

TEST_CASE("numbers: the fast decimal path gives from_chars's double bit for bit",
          "[logs][numbers]") {
  std::mt19937_64 rng(16);
  std::uniform_real_distribution<double> mantissa(-10.0, 10.0);
  std::uniform_int_distribution<int> exponent(-25, 25), digits(1, 17);
  int taken = 0;
  for (int i = 0; i < 200000; ++i) {
    const double v = mantissa(rng) * std::pow(10.0, exponent(rng));
    const int d = digits(rng);
    for (const std::string& text :
         {absl::StrFormat("%.*g", d, v), absl::StrFormat("%.*f", d % 9, v),
          absl::StrFormat("%.*e", d, v)}) {
      double ignored;
      taken += ParseDecimalFast(text, &ignored) ? 1 : 0;
      CheckAgainstFromChars(text);
    }
  }
  // Most of a trainer's numbers take the fast path.
  CHECK(taken > 300000);
  for (const char* exact : {"0", "-0", "7", "3.99226", "1e-05", "1E+3", "0.000123", "-12.5",
                            "9007199254740992", "123456789012345e-22", "1e22"}) {
    CheckAgainstFromChars(exact);
    double v;
    CHECK(ParseDecimalFast(exact, &v));
  }
  double neg_zero = 1.0;
  REQUIRE(ParseDecimalFast("-0.0", &neg_zero));
  CHECK(std::signbit(neg_zero));
}

TEST_CASE("numbers: what the fast path declines still parses or fails as before",
          "[logs][numbers]") {
  // Past its exact range, or not a plain decimal: the fast path says no.
  for (const char* text : {"nan", "inf", "-Infinity", ".5", "1.", "1e", "1e+", "--1", "",
                           "9007199254740993", "1e23", "1e-23", "12345678901234567890",
                           "1.5x", "0x10", "1e99999"}) {
    double v;
    INFO(text);
    CHECK_FALSE(ParseDecimalFast(text, &v));
  }
  // ParseDouble goes on to from_chars: nan, inf, a '+', a long mantissa and
  // far exponents are read; junk is refused.
  double v = 0.0;
  CHECK(ParseDouble("nan", &v));
  CHECK(std::isnan(v));
  CHECK(ParseDouble("-inf", &v));
  CHECK(std::isinf(v));
  CHECK(ParseDouble("+2.5", &v));
  CHECK(v == 2.5);
  CHECK(ParseDouble("9007199254740993", &v));
  CHECK(v == 9007199254740992.0);
  CHECK(ParseDouble("1e-300", &v));
  CHECK(v == 1e-300);
  CHECK_FALSE(ParseDouble("1.5x", &v));
  CHECK_FALSE(ParseDouble("", &v));
}

}  // namespace
}  // namespace trainwatch::logs
