// Timestamps: the project keeps milliseconds since the Unix epoch, the wire
// a google.protobuf.Timestamp.

#ifndef TRAINWATCH_WIRE_TIME_H_
#define TRAINWATCH_WIRE_TIME_H_

#include <cstdint>

#include "google/protobuf/timestamp.pb.h"

namespace trainwatch::wire {

void SetTime(int64_t ms, google::protobuf::Timestamp* t);
// Sub-millisecond nanos are dropped.
int64_t TimeFromProto(const google::protobuf::Timestamp& t);

}  // namespace trainwatch::wire

#endif  // TRAINWATCH_WIRE_TIME_H_
