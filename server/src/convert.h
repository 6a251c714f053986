// Between the core/store types and the trainwatch.v1 wire types. Private to
// server/.

#ifndef TRAINWATCH_SERVER_SRC_CONVERT_H_
#define TRAINWATCH_SERVER_SRC_CONVERT_H_

#include <cstdint>

#include "google/protobuf/timestamp.pb.h"
#include "trainwatch/core/event.h"
#include "ingest.h"
#include "store.h"
#include "trainwatch/v1/common.pb.h"
#include "trainwatch/v1/operator.pb.h"

namespace trainwatch::server {

void SetTime(int64_t ms, google::protobuf::Timestamp* t);
trainwatch::v1::Tier TierToProto(int tier);
// -1 for TIER_UNSPECIFIED (every tier).
int TierFromProto(trainwatch::v1::Tier tier);
trainwatch::v1::Rule RuleToProto(core::EventKind kind);
void StepToProto(const StepRow& s, trainwatch::v1::StepMetrics* out);
// The incident without its summary (lists).
void IncidentToProto(const IncidentRow& r, trainwatch::v1::Incident* out);
void RunToProto(const RunSnapshot& s, int32_t ranks_connected, trainwatch::v1::RunInfo* out);

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_SRC_CONVERT_H_
