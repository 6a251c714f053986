// The server's own rows as trainwatch.v1 API messages. Private to server/;
// every value inside a row converts through trainwatch::wire.

#ifndef TRAINWATCH_SERVER_SRC_CONVERT_H_
#define TRAINWATCH_SERVER_SRC_CONVERT_H_

#include <cstdint>

#include "ingest/ingest.h"
#include "store/store.h"
#include "trainwatch/v1/common.pb.h"
#include "trainwatch/v1/operator.pb.h"
#include "trainwatch/wire/enums.h"
#include "trainwatch/wire/time.h"

namespace trainwatch::server {

void StepToProto(const StepRow& s, trainwatch::v1::StepMetrics* out);
// The incident without its summary (lists).
void IncidentToProto(const IncidentRow& r, trainwatch::v1::Incident* out);
// now_ms: the time its liveness is told against (seconds since its last step).
void RunToProto(const RunView& s, int32_t ranks_connected, int64_t now_ms,
                trainwatch::v1::RunInfo* out);
void AttemptToProto(const AttemptRow& a, trainwatch::v1::AttemptInfo* out);

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_SRC_CONVERT_H_
