#include "trainwatch/core/file_system.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace trainwatch::core {

namespace {

// Closes on every return path.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

absl::Status TooLarge(const std::string& path, size_t max_bytes) {
  return absl::ResourceExhaustedError(
      absl::StrCat("cannot read ", path, ": larger than ", max_bytes, " bytes"));
}

}  // namespace

absl::StatusOr<std::string> LocalFileSystem::ReadFile(const std::string& path) const {
  const std::string what = absl::StrCat("cannot read ", path);
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return absl::ErrnoToStatus(errno, what);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return absl::ErrnoToStatus(errno, what);
  if (S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": it is a directory"));
  }
  if (S_ISREG(st.st_mode) && static_cast<size_t>(st.st_size) > max_bytes_) {
    return TooLarge(path, max_bytes_);
  }
  // Read to the end rather than trusting st_size: a pipe (--tokens <(...))
  // has none, and a file may grow while it is read.
  std::string text;
  char buf[16384];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::ErrnoToStatus(errno, what);
    if (n == 0) break;
    if (text.size() + static_cast<size_t>(n) > max_bytes_) return TooLarge(path, max_bytes_);
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

}  // namespace trainwatch::core
