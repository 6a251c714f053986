// TensorBoard event files (events.out.tfevents.*) as a metrics source.
//
// An event file is a sequence of TFRecords, each
//   uint64  length of the data, little endian
//   uint32  masked CRC32C of those 8 bytes
//   bytes   data: one serialized tensorboard.Event
//   uint32  masked CRC32C of the data
// where masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8.
//
// The readers are fed bytes as they arrive, so a file that a trainer is still
// writing can be read as it grows: a record not yet complete at the end of
// what was fed is "need more bytes", never an error; a CRC that does not match
// is corruption, an error naming the file and the record's byte offset.
//
// Scalars come in two kinds: Summary.Value.simple_value (float), and, in
// newer writers, a Summary.Value.tensor holding one float or double (in
// float_val, double_val or tensor_content). Values of any other kind
// (histograms, images, text, multi-element tensors) are read past.

#ifndef TRAINWATCH_LOGS_TENSORBOARD_H_
#define TRAINWATCH_LOGS_TENSORBOARD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainwatch/logs/metrics_file.h"

namespace trainwatch::logs {

// CRC32C (Castagnoli polynomial, reflected, as in iSCSI and TFRecord).
// ExtendCrc32c(Crc32c(a), b) == Crc32c(a + b).
uint32_t Crc32c(absl::string_view data);
uint32_t ExtendCrc32c(uint32_t crc, absl::string_view data);
// The rotation and offset TFRecord applies to stored CRCs, and its inverse.
uint32_t MaskCrc32c(uint32_t crc);
uint32_t UnmaskCrc32c(uint32_t masked);

// `data` framed as one TFRecord (for writers and tests).
std::string FrameRecord(absl::string_view data);

// What a reader produced on a call.
enum class ReadState {
  kRecord,    // a complete record
  kNeedMore,  // the bytes fed so far end inside a record (or exactly at a
              // record boundary): feed more, or, at the end of a file that
              // is done, see pending()
};

// Splits a byte stream into TFRecords. Not thread-safe.
class RecordReader {
 public:
  // `source` names the stream in errors (a file path).
  explicit RecordReader(std::string source) : source_(std::move(source)) {}

  // Appends the next bytes of the stream.
  void Append(absl::string_view bytes);

  // The next record's data in *record, valid until the next call on this
  // reader. A CRC mismatch is DataLoss naming the source and the record's
  // offset; after one, every call returns the same error.
  absl::StatusOr<ReadState> Next(absl::string_view* record);

  // Stream offset of the first byte not yet returned in a record: the start
  // of the next, possibly partial, record.
  uint64_t offset() const { return consumed_ + pos_; }
  // Bytes fed past offset() (0 at a record boundary).
  size_t pending() const { return buffer_.size() - pos_; }
  // The data length of the partial record, once its header is complete and
  // checked; -1 before that.
  int64_t pending_length() const;
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::string buffer_;  // buffer_[pos_..] is not yet consumed
  size_t pos_ = 0;
  uint64_t consumed_ = 0;  // stream offset of buffer_[0]
  absl::Status error_;
};

// The scalars of one Event.
struct ScalarEvent {
  struct Value {
    std::string tag;
    double value;
  };
  int64_t step = 0;
  double wall_time = 0;
  std::vector<Value> values;  // empty for events without scalars
};

// Decodes one record's data as an Event. Malformed protobuf is an error.
absl::Status DecodeScalarEvent(absl::string_view record, ScalarEvent* out);

// RecordReader and DecodeScalarEvent together: an event file read as it
// grows. Not thread-safe.
class EventFileReader {
 public:
  explicit EventFileReader(std::string source) : records_(std::move(source)) {}

  void Append(absl::string_view bytes) { records_.Append(bytes); }
  // The next event (with or without scalars). Errors name the file and the
  // record's byte offset.
  absl::StatusOr<ReadState> Next(ScalarEvent* event);

  const RecordReader& records() const { return records_; }
  // Events returned so far.
  int64_t events() const { return events_; }
  // "FILE: byte offset N: torn record (...)" when the bytes fed end inside a
  // record; empty at a record boundary. What a finished file's reader says
  // about a writer that stopped mid-record.
  std::string TornTail() const;

 private:
  RecordReader records_;
  int64_t events_ = 0;
};

// True for TensorBoard's file names: "events.out.tfevents.<time>.<host>...".
bool IsEventFileName(absl::string_view file_name);
// True when `content` starts with a TFRecord header whose length CRC checks.
bool LooksLikeEventFile(absl::string_view content);

// One event file's bytes (not owned) and the name used in messages.
struct EventFileData {
  std::string source;
  absl::string_view content;
};

// The signal a scalar tag feeds: by --map (`map`), else by its usual name
// unless --map gives that signal another tag. Returns the index of the
// `map` entry used, kUsualTagName, or kUnmappedTag (the tag is read past).
inline constexpr int kUsualTagName = -1;
inline constexpr int kUnmappedTag = -2;
int SignalOfTag(absl::string_view tag, const ColumnMap& map, core::Signal* out);

// Reads event files as one run. Scalars are merged by step; where several
// values of one metric share a step (a restart that logs steps again, two
// files), the one with the latest wall time wins, then the later file and
// record. Tags become signals by --map (`map`: {signal, tag}) or by their
// usual names (loss, train/loss, Loss/train, grad_norm, lr, learning_rate, ...,
// case-insensitively); other tags are read past, loss_ema_ratio among them
// (the engine derives it, as it does from every format). A torn final record ends
// its file with a warning in Trace::warnings(); a bad CRC is an error.
// `label` names the run in messages that concern no single file (the folder);
// empty: the first file's name.
absl::StatusOr<Trace> ParseEventFiles(const std::vector<EventFileData>& files,
                                      const ColumnMap& map = ColumnMap(),
                                      absl::string_view label = absl::string_view());

// Reads `path`: an event file, or a folder whose events.out.tfevents.* files
// (in name order, which is creation order) are read as one run.
absl::StatusOr<Trace> ReadEventFiles(const std::string& path, const ColumnMap& map = ColumnMap());

}  // namespace trainwatch::logs

#endif  // TRAINWATCH_LOGS_TENSORBOARD_H_
