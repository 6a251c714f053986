#include "trainwatch/wire/time.h"

namespace trainwatch::wire {

void SetTime(int64_t ms, google::protobuf::Timestamp* t) {
  t->set_seconds(ms / 1000);
  t->set_nanos(static_cast<int32_t>((ms % 1000) * 1'000'000));
}

int64_t TimeFromProto(const google::protobuf::Timestamp& t) {
  return t.seconds() * 1000 + t.nanos() / 1'000'000;
}

}  // namespace trainwatch::wire
