// What every fuzz target in this folder shares: the libFuzzer entry point's
// declaration and a helper that turns its bytes into a string_view.
//
// A target returns 0 for every input; it fails only by crashing (an ASan or
// UBSan report, an uncaught exception, or a FUZZ_CHECK that does not hold),
// which is the one thing libFuzzer reports.

#ifndef TRAINWATCH_FUZZ_FUZZ_TARGET_H_
#define TRAINWATCH_FUZZ_FUZZ_TARGET_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/string_view.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace trainwatch::fuzz {

inline absl::string_view Bytes(const uint8_t* data, size_t size) {
  return absl::string_view(reinterpret_cast<const char*>(data), size);
}

}  // namespace trainwatch::fuzz

// A property the target checks on inputs the code under test accepted; a
// failure aborts, so libFuzzer keeps the input as a crash.
#define FUZZ_CHECK(cond)                                                        \
  do {                                                                          \
    if (!(cond)) {                                                              \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n", __FILE__, __LINE__, \
                   #cond);                                                      \
      std::abort();                                                             \
    }                                                                           \
  } while (0)

#endif  // TRAINWATCH_FUZZ_FUZZ_TARGET_H_
