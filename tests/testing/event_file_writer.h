// A small TensorBoard event writer for the tests. It encodes the protobuf
// wire format by hand, from the field numbers of TensorBoard's event.proto,
// summary.proto and tensor.proto, so the reader's generated code is checked
// against an encoding it did not produce.

#ifndef TRAINWATCH_TESTS_TESTING_EVENT_FILE_WRITER_H_
#define TRAINWATCH_TESTS_TESTING_EVENT_FILE_WRITER_H_

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "trainwatch/logs/tensorboard.h"

namespace trainwatch::logs::testing {

// How a scalar is written: TensorBoard's two kinds, with the three places a
// tensor may hold its value.
enum class ScalarKind {
  kSimpleValue,    // Summary.Value.simple_value (float), torch's add_scalar
  kFloatVal,       // tensor DT_FLOAT, float_val
  kDoubleVal,      // tensor DT_DOUBLE, double_val
  kFloatContent,   // tensor DT_FLOAT, tensor_content
  kDoubleContent,  // tensor DT_DOUBLE, tensor_content
};

class ProtoWriter {
 public:
  void Varint(int field, uint64_t v) {
    Key(field, 0);
    Raw(v);
  }
  void Double(int field, double v) {
    Key(field, 1);
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    Fixed(bits, 8);
  }
  void Float(int field, float v) {
    Key(field, 5);
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    Fixed(bits, 4);
  }
  void Bytes(int field, const std::string& b) {
    Key(field, 2);
    Raw(b.size());
    out_ += b;
  }
  const std::string& str() const { return out_; }

 private:
  void Key(int field, int wire) { Raw(static_cast<uint64_t>(field) << 3 | wire); }
  void Raw(uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    out_.push_back(static_cast<char>(v));
  }
  void Fixed(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  std::string out_;
};

inline std::string LittleEndian(const void* p, int bytes) {
  // The test hosts are little endian, as TFRecord is.
  return std::string(static_cast<const char*>(p), static_cast<size_t>(bytes));
}

// Summary.Value for one scalar.
inline std::string ScalarValue(const std::string& tag, double v, ScalarKind kind,
                               bool with_metadata = false) {
  ProtoWriter value;
  value.Bytes(1, tag);
  if (with_metadata) {
    ProtoWriter plugin, meta;
    plugin.Bytes(1, "scalars");
    meta.Bytes(1, plugin.str());
    meta.Varint(4, 1);  // DATA_CLASS_SCALAR
    value.Bytes(9, meta.str());
  }
  if (kind == ScalarKind::kSimpleValue) {
    value.Float(2, static_cast<float>(v));
    return value.str();
  }
  const bool is_double = kind == ScalarKind::kDoubleVal || kind == ScalarKind::kDoubleContent;
  ProtoWriter tensor, shape;
  tensor.Varint(1, is_double ? 2 : 1);  // DT_DOUBLE : DT_FLOAT
  tensor.Bytes(2, shape.str());         // rank 0: no dims
  const float f = static_cast<float>(v);
  switch (kind) {
    case ScalarKind::kFloatVal:  // packed, as proto3 writers encode it
      tensor.Bytes(5, LittleEndian(&f, 4));
      break;
    case ScalarKind::kDoubleVal:
      tensor.Bytes(6, LittleEndian(&v, 8));
      break;
    case ScalarKind::kFloatContent:
      tensor.Bytes(4, LittleEndian(&f, 4));
      break;
    default:
      tensor.Bytes(4, LittleEndian(&v, 8));
      break;
  }
  value.Bytes(8, tensor.str());
  return value.str();
}

// A framed Event holding `values` (serialized Summary.Value messages).
inline std::string EventRecord(int64_t step, double wall_time,
                               const std::vector<std::string>& values) {
  ProtoWriter summary, event;
  for (const std::string& v : values) summary.Bytes(1, v);
  event.Double(1, wall_time);
  event.Varint(2, static_cast<uint64_t>(step));
  event.Bytes(5, summary.str());
  return FrameRecord(event.str());
}

inline std::string ScalarRecord(int64_t step, double wall_time, const std::string& tag, double v,
                                ScalarKind kind = ScalarKind::kSimpleValue) {
  return EventRecord(step, wall_time, {ScalarValue(tag, v, kind)});
}

// The record every writer starts a file with.
inline std::string FileVersionRecord(double wall_time) {
  ProtoWriter event;
  event.Double(1, wall_time);
  event.Bytes(3, "brain.Event:2");
  return FrameRecord(event.str());
}

// A text summary (a DT_STRING tensor), which a replay reads past.
inline std::string TextRecord(int64_t step, double wall_time, const std::string& tag,
                              const std::string& text) {
  ProtoWriter tensor, shape, value;
  tensor.Varint(1, 7);  // DT_STRING
  tensor.Bytes(2, shape.str());
  tensor.Bytes(8, text);
  value.Bytes(1, tag);
  value.Bytes(8, tensor.str());
  return EventRecord(step, wall_time, {value.str()});
}

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

}  // namespace trainwatch::logs::testing

#endif  // TRAINWATCH_TESTS_TESTING_EVENT_FILE_WRITER_H_
