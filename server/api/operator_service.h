// The OperatorService (twctl's API), over the state the services share.

#ifndef TRAINWATCH_SERVER_OPERATOR_SERVICE_H_
#define TRAINWATCH_SERVER_OPERATOR_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <memory>

#include "api/service_state.h"

namespace trainwatch::server {

std::unique_ptr<grpc::Service> NewOperatorService(ServiceState* state);

}  // namespace trainwatch::server

#endif  // TRAINWATCH_SERVER_OPERATOR_SERVICE_H_
