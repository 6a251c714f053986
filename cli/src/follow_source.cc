#include "follow_source.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "trainwatch/logs/trace_builder.h"

namespace trainwatch::cli {

using logs::EventFileReader;
using logs::IsEventFileName;
using logs::NewestFileNamed;
using logs::ReadState;
using logs::ScalarEvent;

namespace {

absl::Status ErrnoError(absl::string_view what, absl::string_view path) {
  return absl::UnavailableError(absl::StrCat(path, ": ", what, ": ", std::strerror(errno)));
}

// Reads up to max_bytes from fd into *out; the count, 0 at EOF, -1 on error.
ssize_t ReadSome(int fd, std::string* out, size_t max_bytes) {
  const size_t old = out->size();
  out->resize(old + max_bytes);
  ssize_t n;
  do {
    n = ::read(fd, out->data() + old, max_bytes);
  } while (n < 0 && errno == EINTR);
  out->resize(old + static_cast<size_t>(std::max<ssize_t>(n, 0)));
  return n;
}

}  // namespace

FileTail::~FileTail() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status FileTail::Open(bool* opened) {
  *opened = false;
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::OkStatus();  // not there yet: waited for
    return ErrnoError("cannot open", path_);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path_,
                     ": is a folder; a folder is followed as TensorBoard event files "
                     "(--format tensorboard)"));
  }
  fd_ = fd;
  inode_ = st.st_ino;
  device_ = st.st_dev;
  offset_ = 0;
  first_line_.clear();
  first_line_whole_ = false;
  *opened = true;
  return absl::OkStatus();
}

absl::StatusOr<TailEvent> FileTail::Poll(std::string* out, size_t max_bytes) {
  if (fd_ < 0) {
    bool opened;
    if (absl::Status s = Open(&opened); !s.ok()) return s;
    if (!opened) return TailEvent::kIdle;
  }
  if (watch_first_line_ && FirstLineChanged()) {
    // Rewritten whole, longer than what was read (a shorter file is a
    // truncation, below): what follows offset_ is not what came after it.
    if (::lseek(fd_, 0, SEEK_SET) < 0) return ErrnoError("seek", path_);
    offset_ = 0;
    first_line_.clear();
    first_line_whole_ = false;
    reason_ = "rewritten";
    ++restarts_;
    return TailEvent::kRestart;
  }
  const size_t before = out->size();
  const ssize_t n = ReadSome(fd_, out, max_bytes);
  if (n < 0) return ErrnoError("read", path_);
  if (n > 0) {
    if (!first_line_whole_ && offset_ == first_line_.size()) {
      const absl::string_view got(out->data() + before, static_cast<size_t>(n));
      const size_t nl = got.find('\n');
      first_line_.append(got.data(), nl == absl::string_view::npos ? got.size() : nl + 1);
      first_line_whole_ = nl != absl::string_view::npos;
    }
    offset_ += static_cast<uint64_t>(n);
    writer_gone_ = false;
    return TailEvent::kData;
  }
  // At the end of what the open file holds: has the path moved on?
  struct stat now;
  if (::stat(path_.c_str(), &now) == 0 && (now.st_ino != inode_ || now.st_dev != device_)) {
    // Rotated: the old file is read to its end (this read said so), the
    // writer now writes the new one.
    ::close(fd_);
    fd_ = -1;
    bool opened;
    if (absl::Status s = Open(&opened); !s.ok()) return s;
    writer_seen_ = writer_gone_ = false;  // of the old file
    reason_ = "rotated";
    ++restarts_;
    return TailEvent::kRestart;
  }
  struct stat mine;
  if (::fstat(fd_, &mine) == 0 && static_cast<uint64_t>(mine.st_size) < offset_) {
    // Truncated in place (copytruncate, `> log`): the writer starts over.
    if (::lseek(fd_, 0, SEEK_SET) < 0) return ErrnoError("seek", path_);
    offset_ = 0;
    first_line_.clear();  // the new content's is read anew
    first_line_whole_ = false;
    reason_ = "truncated";
    ++restarts_;
    return TailEvent::kRestart;
  }
  return TailEvent::kIdle;
}

bool FileTail::WriterGone() {
  const int64_t now = absl::ToUnixMillis(absl::Now());
  if (fd_ < 0 || now - writer_checked_ms_ < kWriterCheckMs) return writer_gone_;
  writer_checked_ms_ = now;
  switch (FindWriter(device_, inode_, &writer_pid_)) {
    case OpenForWriting::kYes:
      writer_seen_ = true;
      writer_gone_ = false;
      break;
    case OpenForWriting::kNo:
      writer_gone_ = writer_seen_;
      break;
    case OpenForWriting::kUnknown:
      break;
  }
  return writer_gone_;
}

namespace {

// Whether `pid` has the file open for writing.
bool HasOpenForWriting(pid_t pid, dev_t device, ino_t inode) {
  const std::string fds = absl::StrCat("/proc/", pid, "/fd");
  DIR* dir = ::opendir(fds.c_str());
  if (dir == nullptr) return false;  // gone, or not ours to read
  bool found = false;
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    struct stat st;
    if (::stat(absl::StrCat(fds, "/", e->d_name).c_str(), &st) != 0 ||
        st.st_ino != inode || st.st_dev != device) {
      continue;
    }
    // Open for reading only (another follower, a `tail -f`) is no writer.
    std::ifstream info(absl::StrCat("/proc/", pid, "/fdinfo/", e->d_name));
    std::string key;
    while (info >> key) {
      if (key != "flags:") continue;
      std::string octal;
      info >> octal;
      const unsigned long flags = std::strtoul(octal.c_str(), nullptr, 8);
      found = (flags & O_ACCMODE) != O_RDONLY;
      break;
    }
    if (found) break;
  }
  ::closedir(dir);
  return found;
}

}  // namespace

OpenForWriting FindWriter(dev_t device, ino_t inode, pid_t* hint) {
  const pid_t self = ::getpid();
  if (*hint > 0 && *hint != self && HasOpenForWriting(*hint, device, inode)) {
    return OpenForWriting::kYes;
  }
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return OpenForWriting::kUnknown;
  OpenForWriting result = OpenForWriting::kNo;
  while (const dirent* e = ::readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || pid == self) continue;
    if (HasOpenForWriting(static_cast<pid_t>(pid), device, inode)) {
      *hint = static_cast<pid_t>(pid);
      result = OpenForWriting::kYes;
      break;
    }
  }
  ::closedir(proc);
  return result;
}

bool FileTail::FirstLineChanged() {
  if (!first_line_whole_) return false;
  std::string now(first_line_.size(), '\0');
  ssize_t n;
  do {
    n = ::pread(fd_, now.data(), now.size(), 0);
  } while (n < 0 && errno == EINTR);
  // A shorter file is a truncation, which Poll() sees by its size.
  return n == static_cast<ssize_t>(now.size()) && now != first_line_;
}

std::string WholeFileTail::Resolve() const {
  std::error_code ec;
  if (file_name_.empty() || !std::filesystem::is_directory(path_, ec)) return path_;
  return NewestFileNamed(path_, file_name_);
}

absl::StatusOr<TailEvent> WholeFileTail::Poll(std::string* out, size_t max_bytes) {
  if (given_ < content_.size()) {
    const size_t n = std::min(max_bytes, content_.size() - given_);
    out->append(content_, given_, n);
    given_ += n;
    return TailEvent::kData;
  }
  Version now;
  struct stat st;
  const std::string path = Resolve();
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": is a folder"));
    }
    now.exists = true;
    now.inode = st.st_ino;
    now.size = st.st_size;
    now.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  } else if (errno != ENOENT) {
    return ErrnoError("cannot stat", path);
  }
  const bool settled = now == seen_;
  seen_ = now;
  if (!now.exists || !settled || (read_any_ && now == read_)) return TailEvent::kIdle;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return TailEvent::kIdle;
    return ErrnoError("cannot open", path);
  }
  content_.clear();
  given_ = 0;
  for (;;) {
    const ssize_t n = ReadSome(fd, &content_, 1 << 20);
    if (n < 0) {
      ::close(fd);
      return ErrnoError("read", path);
    }
    if (n == 0) break;
  }
  ::close(fd);
  read_ = now;
  if (read_any_) {
    ++restarts_;
    return TailEvent::kRestart;
  }
  read_any_ = true;
  given_ = std::min(max_bytes, content_.size());
  out->append(content_, 0, given_);
  return TailEvent::kData;
}

void TextTail::WaitForData(int64_t max_ms) { absl::SleepFor(absl::Milliseconds(max_ms)); }

void StdinTail::WaitForData(int64_t max_ms) {
  struct pollfd p = {0, POLLIN, 0};
  // EINTR (a stop signal) returns early, as it should.
  ::poll(&p, 1, static_cast<int>(max_ms));
}

absl::StatusOr<TailEvent> StdinTail::Poll(std::string* out, size_t max_bytes) {
  struct pollfd p = {0, POLLIN, 0};
  const int ready = ::poll(&p, 1, 0);
  if (ready < 0 && errno != EINTR) return ErrnoError("poll", "<stdin>");
  if (ready <= 0) return TailEvent::kIdle;
  const ssize_t n = ReadSome(0, out, max_bytes);
  if (n < 0) {
    if (errno == EAGAIN) return TailEvent::kIdle;
    return ErrnoError("read", "<stdin>");
  }
  return n == 0 ? TailEvent::kEnd : TailEvent::kData;
}

bool LineSplitter::Next(absl::string_view* line) {
  const size_t end = buffer_.find('\n', pos_);
  if (end == std::string::npos) {
    // Keep the buffer from growing with what was consumed.
    if (pos_ > 0) {
      buffer_.erase(0, pos_);
      pos_ = 0;
    }
    return false;
  }
  *line = absl::string_view(buffer_).substr(pos_, end - pos_);
  pos_ = end + 1;
  if (!line->empty() && line->back() == '\r') line->remove_suffix(1);
  return true;
}

bool LineSplitter::Flush(std::string* line) {
  line->assign(buffer_, pos_, std::string::npos);
  buffer_.clear();
  pos_ = 0;
  if (!line->empty() && line->back() == '\r') line->pop_back();
  return !line->empty();
}

EventFolder::~EventFolder() {
  for (File& f : files_) {
    if (f.fd >= 0) ::close(f.fd);
  }
}

absl::Status EventFolder::Discover() {
  std::error_code ec;
  std::vector<std::string> names;
  if (!std::filesystem::is_directory(path_, ec)) {
    if (files_.empty() && std::filesystem::exists(path_, ec)) names.push_back(path_);
  } else {
    for (const auto& entry : std::filesystem::directory_iterator(path_, ec)) {
      if (IsEventFileName(entry.path().filename().string())) {
        names.push_back(entry.path().string());
      }
    }
    if (ec) return absl::UnavailableError(absl::StrCat(path_, ": cannot list: ", ec.message()));
    std::sort(names.begin(), names.end());
  }
  for (const std::string& name : names) {
    const bool known =
        std::any_of(files_.begin(), files_.end(), [&](const File& f) { return f.path == name; });
    // Only files after the last known one: an earlier name appearing late
    // would reorder what was already sent.
    if (known || (!files_.empty() && name < files_.back().path)) continue;
    File f;
    f.path = name;
    f.fd = ::open(name.c_str(), O_RDONLY | O_CLOEXEC);
    if (f.fd < 0) return ErrnoError("cannot open", name);
    f.reader = std::make_unique<EventFileReader>(name);
    files_.push_back(std::move(f));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> EventFolder::Next(ScalarEvent* event) {
  for (bool discovered = false;;) {
    while (current_ < files_.size()) {
      File& f = files_[current_];
      for (;;) {
        absl::StatusOr<ReadState> state = f.reader->Next(event);
        if (!state.ok()) return state.status();
        if (*state == ReadState::kRecord) {
          if (!event->values.empty()) return true;
          continue;  // file version, graphs, histograms: read past
        }
        std::string bytes;
        const ssize_t n = ReadSome(f.fd, &bytes, 1 << 16);
        if (n < 0) return ErrnoError("read", f.path);
        if (n == 0) break;
        f.reader->Append(bytes);
      }
      // Nothing complete in this file now. A later file means the writer
      // moved on (a new run of the trainer): this one is finished.
      if (current_ + 1 >= files_.size()) break;
      ++current_;
    }
    if (discovered) return false;
    if (absl::Status s = Discover(); !s.ok()) return s;
    discovered = true;
  }
}

uint64_t EventFolder::pending_bytes() const {
  uint64_t n = 0;
  for (const File& f : files_) n += f.reader->records().pending();
  return n;
}

}  // namespace trainwatch::cli
