// kernels_gpu_test: the standalone runner of the GPU cases (check.h), for a
// GPU machine without Catch2. It runs every registered case and prints one
// line per case and a total.
//
// Exit status:
//   0   every case ran on a device and passed, each with at least one
//       assertion;
//   1   a case failed, asserted nothing, or skipped although a device is
//       present (a case that did not run is not a pass);
//   77  no CUDA device (or a build without CUDA): nothing ran. CTest reports
//       that as skipped (SKIP_RETURN_CODE); bench/gpu_check.sh, where
//       nvidia-smi sees a GPU, as a failure.
//
//   kernels_gpu_test [--list] [SUBSTRING]   runs the cases whose name
//                                           contains SUBSTRING

#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "check.h"

#if defined(TRAINWATCH_KERNELS_HAVE_CUDA)
#include "trainwatch/kernels/cuda.h"
#endif

namespace trainwatch::kernels::testing::runner {
namespace {

struct Case {
  const char* name;
  CaseFn fn;
};

std::vector<Case>& Cases() {
  static std::vector<Case> cases;
  return cases;
}

struct Current {
  int assertions = 0;
  int failures = 0;
  std::vector<std::string> info;
};

Current& Now() {
  static Current c;
  return c;
}

int DeviceCount() {
#if defined(TRAINWATCH_KERNELS_HAVE_CUDA)
  return CudaDeviceCount();
#else
  return 0;
#endif
}

}  // namespace

Registrar::Registrar(const char* name, CaseFn fn) {
  Cases().push_back({name, fn});
}

bool Record(bool ok, const char* expr, const char* file, int line,
            const std::string& detail) {
  Current& c = Now();
  ++c.assertions;
  if (ok) return true;
  ++c.failures;
  std::printf("  %s:%d: FAILED: %s\n", file, line, expr);
  for (const std::string& i : c.info) std::printf("    with %s\n", i.c_str());
  if (!detail.empty()) std::printf("    %s\n", detail.c_str());
  return false;
}

ScopedInfo::ScopedInfo(std::string text) {
  Now().info.push_back(std::move(text));
}
ScopedInfo::~ScopedInfo() { Now().info.pop_back(); }

int RunAll(int argc, char** argv) {
  const char* filter = nullptr;
  bool list = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--list") == 0) {
      list = true;
    } else {
      filter = argv[i];
    }
  }
  if (list) {
    for (const Case& c : Cases()) std::printf("%s\n", c.name);
    return 0;
  }
  const int devices = DeviceCount();
  if (devices == 0) {
    std::printf(
        "kernels_gpu_test: %s; none of the %zu GPU cases ran\n",
#if defined(TRAINWATCH_KERNELS_HAVE_CUDA)
        "no CUDA device",
#else
        "built without CUDA",
#endif
        Cases().size());
    return 77;
  }
  int ran = 0, passed = 0, failed = 0;
  for (const Case& c : Cases()) {
    if (filter != nullptr && std::strstr(c.name, filter) == nullptr) continue;
    ++ran;
    Now() = Current();
    std::string verdict;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      c.fn();
    } catch (const RequireFailed&) {
      // Already recorded; the case stops at its first failed REQUIRE.
    } catch (const Skipped& s) {
      verdict = "NOT RUN (" + s.reason + ") with a device present";
    } catch (const std::exception& e) {
      Record(false, "unexpected exception", c.name, 0, e.what());
    }
    const double s = std::chrono::duration<double>(
                         std::chrono::steady_clock::now() - t0)
                         .count();
    if (verdict.empty()) {
      if (Now().failures > 0) {
        verdict = "FAILED (" + std::to_string(Now().failures) + " of " +
                  std::to_string(Now().assertions) + " assertions)";
      } else if (Now().assertions == 0) {
        verdict = "FAILED (asserted nothing)";
      }
    }
    if (verdict.empty()) {
      ++passed;
      std::printf("PASS  %6.2fs  %s (%d assertions)\n", s, c.name,
                  Now().assertions);
    } else {
      ++failed;
      std::printf("FAIL  %6.2fs  %s: %s\n", s, c.name, verdict.c_str());
    }
    std::fflush(stdout);
  }
  std::printf("kernels_gpu_test: %d cases, %d passed, %d failed\n", ran,
              passed, failed);
  if (ran == 0) {
    std::printf("kernels_gpu_test: no case matched\n");
    return 1;
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace trainwatch::kernels::testing::runner

int main(int argc, char** argv) {
  return trainwatch::kernels::testing::runner::RunAll(argc, argv);
}
