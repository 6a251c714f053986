// The Prometheus exporter: every /metrics scrape reads the live state (the
// ingestor's snapshot and stats, the open streams, the pager's counters),
// so there are no shadow counters to keep in step.

#ifndef TRAINWATCH_SERVER_EXPORTER_H_
#define TRAINWATCH_SERVER_EXPORTER_H_

#include <prometheus/collectable.h>

#include <memory>

#include "service_state.h"

namespace trainwatch::server {

std::shared_ptr<prometheus::Collectable> NewExporter(ServiceState* state);

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_EXPORTER_H_
