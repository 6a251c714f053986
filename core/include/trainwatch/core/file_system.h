// The one seam for the small files trainwatch reads whole: tokens, TLS
// certificates and keys, rule thresholds, twctl's config and CA file. A
// caller that takes a FileSystem can be tested with an in-memory fake; the
// local one turns every way a read can fail (missing, a directory, no
// permission, too large) into a status naming the path, where a plain
// std::ifstream would throw on a directory or silently read nothing.

#ifndef TRAINWATCH_CORE_FILE_SYSTEM_H_
#define TRAINWATCH_CORE_FILE_SYSTEM_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace trainwatch::core {

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  // The whole file. Every error message names `path`.
  virtual absl::StatusOr<std::string> ReadFile(const std::string& path) const = 0;
};

// POSIX files. A missing file is NOT_FOUND, no permission PERMISSION_DENIED,
// a directory FAILED_PRECONDITION and a file over `max_bytes`
// RESOURCE_EXHAUSTED: the files read this way are configuration, and a
// multi-gigabyte one is a wrong path, not something to load into memory.
class LocalFileSystem final : public FileSystem {
 public:
  static constexpr size_t kDefaultMaxBytes = size_t{64} << 20;

  explicit LocalFileSystem(size_t max_bytes = kDefaultMaxBytes) : max_bytes_(max_bytes) {}
  absl::StatusOr<std::string> ReadFile(const std::string& path) const override;

 private:
  size_t max_bytes_;
};

}  // namespace trainwatch::core

#endif  // TRAINWATCH_CORE_FILE_SYSTEM_H_
