// Private to cli/: the sources `twctl follow` reads as they grow.
//
//   FileTail      a path followed like `tail -F`: a file that does not exist
//                 yet is waited for; rotation (the path names another inode)
//                 finishes the old file, then opens the new one from byte 0;
//                 truncation (the size went below what was read) starts
//                 again from byte 0; with WatchFirstLine(), so does a first
//                 line that changed (a CSV rewritten whole with a new
//                 header, as Lightning's CSVLogger does when a metric first
//                 appears), as "rewritten".
//   StdinTail     standard input (a pipe, `kubectl logs -f`); EOF ends it.
//   WholeFileTail a file its writer rewrites whole (Hugging Face's
//                 trainer_state.json): each version, once it has stood still
//                 for a poll, is a new stream (kRestart, then its bytes).
//   EventFolder   a TensorBoard log folder: its events.out.tfevents.* files
//                 in name order (creation order), each read as it grows, new
//                 ones as they appear; a record not yet complete is waited
//                 for, a bad CRC is an error naming the file and offset.
//
// Every Poll() returns at once with what is there; between polls of an idle
// source the caller calls WaitForData() with how long it may wait, and
// checks its stop flag in between.

#ifndef TRAINWATCH_CLI_SRC_FOLLOW_SOURCE_H_
#define TRAINWATCH_CLI_SRC_FOLLOW_SOURCE_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainwatch/logs/tensorboard.h"

namespace trainwatch::cli {

// What a text source's Poll() found.
enum class TailEvent {
  kData,     // bytes were appended
  kIdle,     // nothing new (or the file does not exist yet)
  kRestart,  // the file was rotated or truncated: what follows is a new
             // stream; everything of the old one was given before
  kEnd,      // end of input (standard input only)
};

// A text stream read as it grows.
class TextTail {
 public:
  virtual ~TextTail() = default;
  // Appends up to `max_bytes` new bytes to *out. Errors (a read error, a
  // path that is a folder) name the source.
  virtual absl::StatusOr<TailEvent> Poll(std::string* out, size_t max_bytes) = 0;
  // After a kIdle: returns when there may be more to read, at the latest
  // after `max_ms` (or on a signal). A file cannot say when it grows, so
  // the default sleeps the whole time.
  virtual void WaitForData(int64_t max_ms);
  // What the last kRestart was ("rotated", "truncated"), for the status.
  virtual std::string RestartReason() const { return ""; }
  // Rotations and truncations seen.
  virtual int64_t restarts() const { return 0; }
  // After a kIdle: true when the source's writer is known to be gone, so
  // that its silence is the job's end, not a stall. Standard input says so
  // by its end instead; a source whose writer cannot be seen says false.
  virtual bool WriterGone() { return false; }
};

class FileTail : public TextTail {
 public:
  explicit FileTail(std::string path) : path_(std::move(path)) {}
  ~FileTail() override;
  absl::StatusOr<TailEvent> Poll(std::string* out, size_t max_bytes) override;
  std::string RestartReason() const override { return reason_; }
  int64_t restarts() const override { return restarts_; }
  // From now on, a first line that is no longer the one read is a rewrite
  // (kRestart, "rewritten"): for a CSV, whose first line is its header.
  void WatchFirstLine() { watch_first_line_ = true; }
  // No process has the file open for writing any more, after one had (as
  // /proc shows the processes this user may read: the follower on the
  // job's host; where none was ever seen, as over a network file system
  // from another host, false). Looked at no more often than every
  // kWriterCheckMs; new bytes say the writer is back.
  bool WriterGone() override;
  static constexpr int64_t kWriterCheckMs = 2000;

 private:
  absl::Status Open(bool* opened);
  // The first line read, once whole and while watched: still the file's?
  bool FirstLineChanged();

  std::string path_;
  bool watch_first_line_ = false;
  std::string first_line_;  // the first bytes read, up to the first '\n'
  bool first_line_whole_ = false;
  int fd_ = -1;
  ino_t inode_ = 0;
  dev_t device_ = 0;
  uint64_t offset_ = 0;  // bytes read from the open file
  std::string reason_;
  int64_t restarts_ = 0;
  bool writer_seen_ = false;  // a writer of the open file was seen
  bool writer_gone_ = false;
  pid_t writer_pid_ = 0;      // the one seen last, looked at first
  int64_t writer_checked_ms_ = 0;
};

// Whether a process other than this one has the file (`device`, `inode`)
// open for writing, as /proc shows it; `hint` (in and out): a pid to look
// at first, and the writer found. kUnknown: /proc cannot be read.
enum class OpenForWriting { kYes, kNo, kUnknown };
OpenForWriting FindWriter(dev_t device, ino_t inode, pid_t* hint);

// A file rewritten whole: truncated and written longer, which a FileTail
// cannot tell from an append. A version is read once its size and mtime
// have stood still between two polls (the writer is done), and each new
// version after the first is announced with kRestart before its bytes.
//
// `path` may be a folder, with `file_name`: then the newest FOLDER/NAME or
// FOLDER/*/NAME is the file (a Trainer's output folder, whose
// checkpoint-N/trainer_state.json is written at each save). Its versions
// are told apart by inode, size and mtime, so moving on to the next
// checkpoint's file is a new version like a rewrite.
class WholeFileTail : public TextTail {
 public:
  explicit WholeFileTail(std::string path, std::string file_name = "")
      : path_(std::move(path)), file_name_(std::move(file_name)) {}
  absl::StatusOr<TailEvent> Poll(std::string* out, size_t max_bytes) override;
  std::string RestartReason() const override { return "rewritten"; }
  int64_t restarts() const override { return restarts_; }

 private:
  struct Version {
    bool exists = false;
    ino_t inode = 0;
    off_t size = 0;
    int64_t mtime_ns = 0;
    bool operator==(const Version& o) const {
      return exists == o.exists && inode == o.inode && size == o.size && mtime_ns == o.mtime_ns;
    }
  };
  // The file to read now: path_, or the newest file_name_ under it.
  std::string Resolve() const;

  std::string path_;
  std::string file_name_;
  Version seen_;  // at the last poll
  Version read_;  // the version read last
  bool read_any_ = false;
  std::string content_;  // the version being given out
  size_t given_ = 0;
  int64_t restarts_ = 0;
};

class StdinTail : public TextTail {
 public:
  absl::StatusOr<TailEvent> Poll(std::string* out, size_t max_bytes) override;
  // Wakes as soon as the pipe has data: a sleep would cap the rate at one
  // pipe buffer (64 KiB) per wait while the writer blocks on the full pipe.
  void WaitForData(int64_t max_ms) override;
};

// Splits a text stream into lines as they complete. An unterminated final
// fragment is a line only when the stream ends or restarts (Flush).
class LineSplitter {
 public:
  void Append(absl::string_view bytes) { buffer_.append(bytes.data(), bytes.size()); }
  // The next complete line (a trailing '\r' dropped), valid until the next
  // call; false when none is complete.
  bool Next(absl::string_view* line);
  // The unterminated rest as a final line, if any; then empty.
  bool Flush(std::string* line);
  size_t pending() const { return buffer_.size() - pos_; }

 private:
  std::string buffer_;
  size_t pos_ = 0;
};

// A TensorBoard log folder (or one event file) read as it grows.
class EventFolder {
 public:
  // `path`: a folder, or one event file.
  explicit EventFolder(std::string path) : path_(std::move(path)) {}
  ~EventFolder();
  // The next event with scalars in *event and true; false when nothing
  // complete is there now (a torn final record is waited for). A bad CRC
  // or malformed event is an error naming the file and offset.
  absl::StatusOr<bool> Next(logs::ScalarEvent* event);
  int64_t files() const { return static_cast<int64_t>(files_.size()); }
  // Bytes fed past the last complete record, over every file: a torn tail
  // not yet completed.
  uint64_t pending_bytes() const;

 private:
  struct File {
    std::string path;
    int fd = -1;
    std::unique_ptr<logs::EventFileReader> reader;
  };
  absl::Status Discover();

  std::string path_;
  std::vector<File> files_;  // in name order; the last may still grow
  size_t current_ = 0;
};

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLI_SRC_FOLLOW_SOURCE_H_
