// The assertions shared by the kernel tests, on one of two harnesses:
//   - Catch2 v2 (kernels_test), where Catch2 is installed;
//   - the standalone runner of gpu_runner.cc (kernels_gpu_test), selected by
//     TRAINWATCH_KERNELS_STANDALONE_RUNNER: it needs nothing but the standard
//     library, so the GPU cases build and run on a GPU machine that has only
//     CUDA and CMake.
// A file written against these macros compiles into either. Only the GPU
// cases (gpu_test.cc) and the test data use them; the CPU cases use Catch2
// directly.
//
//   TW_TEST_CASE("name") { ... }   a case, tagged [gpu] under Catch2
//   TW_CHECK(cond)                 records a failure and goes on
//   TW_REQUIRE(cond)               records a failure and leaves the case
//   TW_NO_MISMATCH(str_expr)       checks that a comparison's report is empty
//                                  (the report is printed when it is not)
//   TW_INFO(stream_expr)           context printed with failures in scope
//   TW_SKIP("why")                 leaves the case as not run

#ifndef TRAINWATCH_TESTS_KERNELS_CHECK_H_
#define TRAINWATCH_TESTS_KERNELS_CHECK_H_

#include <sstream>
#include <string>

#ifndef TRAINWATCH_KERNELS_SKIP_MARKER
#define TRAINWATCH_KERNELS_SKIP_MARKER "TRAINWATCH_TEST_SKIPPED"
#endif

#define TW_CHECK_CAT2(a, b) a##b
#define TW_CHECK_CAT(a, b) TW_CHECK_CAT2(a, b)

#if defined(TRAINWATCH_KERNELS_STANDALONE_RUNNER)

#include <vector>

namespace trainwatch::kernels::testing::runner {

using CaseFn = void (*)();

// Registers a case at static initialisation.
struct Registrar {
  Registrar(const char* name, CaseFn fn);
};

// Thrown by TW_REQUIRE to leave the current case; caught by the runner.
struct RequireFailed {};
// Thrown by TW_SKIP.
struct Skipped {
  std::string reason;
};

// Counts the assertion; on failure prints it with the active TW_INFO
// context. Returns `ok`.
bool Record(bool ok, const char* expr, const char* file, int line,
            const std::string& detail = std::string());

// A TW_INFO context line, active while the object lives.
class ScopedInfo {
 public:
  explicit ScopedInfo(std::string text);
  ~ScopedInfo();
  ScopedInfo(const ScopedInfo&) = delete;
  ScopedInfo& operator=(const ScopedInfo&) = delete;
};

}  // namespace trainwatch::kernels::testing::runner

#define TW_TEST_CASE(name)                                                  \
  static void TW_CHECK_CAT(tw_case_, __LINE__)();                           \
  static const ::trainwatch::kernels::testing::runner::Registrar            \
      TW_CHECK_CAT(tw_registrar_, __LINE__)(name,                           \
                                            &TW_CHECK_CAT(tw_case_, __LINE__)); \
  static void TW_CHECK_CAT(tw_case_, __LINE__)()

#define TW_CHECK(cond)                                                  \
  ((void)::trainwatch::kernels::testing::runner::Record(                \
      static_cast<bool>(cond), #cond, __FILE__, __LINE__))

#define TW_REQUIRE(cond)                                                 \
  do {                                                                   \
    if (!::trainwatch::kernels::testing::runner::Record(                 \
            static_cast<bool>(cond), #cond, __FILE__, __LINE__)) {       \
      throw ::trainwatch::kernels::testing::runner::RequireFailed{};     \
    }                                                                    \
  } while (0)

#define TW_NO_MISMATCH(expr)                                        \
  do {                                                              \
    const std::string tw_report_ = (expr);                          \
    ::trainwatch::kernels::testing::runner::Record(                 \
        tw_report_.empty(), #expr, __FILE__, __LINE__, tw_report_); \
  } while (0)

#define TW_INFO(msg)                                                 \
  const ::trainwatch::kernels::testing::runner::ScopedInfo           \
      TW_CHECK_CAT(tw_info_, __LINE__)(                              \
          static_cast<const std::ostringstream&>(std::ostringstream() \
                                                 << msg)              \
              .str())

#define TW_SKIP(reason) \
  throw ::trainwatch::kernels::testing::runner::Skipped { reason }

#else  // Catch2

#include <catch2/catch.hpp>

#define TW_TEST_CASE(name) TEST_CASE(name, "[gpu]")
#define TW_CHECK(cond) CHECK(cond)
#define TW_REQUIRE(cond) REQUIRE(cond)
#define TW_NO_MISMATCH(expr)                    \
  do {                                          \
    const std::string tw_report_ = (expr);      \
    INFO(tw_report_);                           \
    CHECK(tw_report_.empty());                  \
  } while (0)
#define TW_INFO(msg) INFO(msg)
// A Catch2 v2 WARN carrying the marker CTest turns into "skipped".
#define TW_SKIP(reason)                                         \
  do {                                                          \
    WARN(TRAINWATCH_KERNELS_SKIP_MARKER ": " << (reason));      \
    return;                                                     \
  } while (0)

#endif  // TRAINWATCH_KERNELS_STANDALONE_RUNNER

#endif  // TRAINWATCH_TESTS_KERNELS_CHECK_H_
