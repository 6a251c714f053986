// A fresh folder under $TMPDIR (/tmp when unset), removed with everything in
// it when the object goes: for tests and benches, which must leave nothing
// behind (a bench's generated history is hundreds of MB).

#ifndef TRAINWATCH_TESTS_TESTING_TEMP_DIR_H_
#define TRAINWATCH_TESTS_TESTING_TEMP_DIR_H_

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace trainwatch::testing {

class ScopedTempDir {
 public:
  // `prefix`: the folder's name before its random part. path() is empty
  // when the folder could not be made.
  explicit ScopedTempDir(const std::string& prefix) {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/" +
                       prefix + "XXXXXX";
    if (mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~ScopedTempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A folder for this process's scratch files, made on first use, removed at
// exit (ctest runs each test case in a process of its own).
inline const std::string& ProcessTempDir() {
  static const ScopedTempDir dir("trainwatch_test_");
  return dir.path();
}

}  // namespace trainwatch::testing

#endif  // TRAINWATCH_TESTS_TESTING_TEMP_DIR_H_
