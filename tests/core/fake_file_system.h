// An in-memory FileSystem for the tests of code that reads through one: the
// files are a map, anything else is NOT_FOUND, as LocalFileSystem says.

#ifndef TRAINWATCH_TESTS_CORE_FAKE_FILE_SYSTEM_H_
#define TRAINWATCH_TESTS_CORE_FAKE_FILE_SYSTEM_H_

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "trainwatch/core/file_system.h"

namespace trainwatch::core {

class FakeFileSystem : public FileSystem {
 public:
  std::map<std::string, std::string> files;

  absl::StatusOr<std::string> ReadFile(const std::string& path) const override {
    auto it = files.find(path);
    if (it == files.end()) return absl::NotFoundError(absl::StrCat("cannot read ", path));
    return it->second;
  }
};

}  // namespace trainwatch::core

#endif  // TRAINWATCH_TESTS_CORE_FAKE_FILE_SYSTEM_H_
