// What trainwatchd replicas and their clients agree on beyond the protos.

#ifndef TRAINWATCH_WIRE_REPLICAS_H_
#define TRAINWATCH_WIRE_REPLICAS_H_

namespace trainwatch::wire {

// Trailing metadata a standby replica sets on an operator call it refuses
// with ABORTED because only the owner can answer it (a decision, which runs
// have agents connected): twctl then tries its next address. Any other
// ABORTED (the database's serialization failure on the owner) is an answer.
inline constexpr char kStandbyMetadataKey[] = "trainwatch-standby";

}  // namespace trainwatch::wire

#endif  // TRAINWATCH_WIRE_REPLICAS_H_
