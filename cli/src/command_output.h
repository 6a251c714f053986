// How the operator commands write what they got: -o json, the table cells
// several commands share, and a failed call as an exit code and a message.

#ifndef TRAINWATCH_CLI_SRC_COMMAND_OUTPUT_H_
#define TRAINWATCH_CLI_SRC_COMMAND_OUTPUT_H_

#include <google/protobuf/message.h>
#include <grpcpp/support/status.h>

#include <string>

#include "trainwatch/v1/common.pb.h"

namespace trainwatch::cli {

// The message in the proto3 JSON mapping (field names as in the .proto,
// defaults printed), one line.
std::string Json(const google::protobuf::Message& m);

// kOk for OK; else appends "twctl: MESSAGE (CODE)" to *err and returns kRefused
// for FAILED_PRECONDITION, kUsage for INVALID_ARGUMENT, kError otherwise.
int FromStatus(const grpc::Status& s, std::string* err);

// A metric value in a table cell: four significant digits, "nan".
std::string Fmt(double v);
// The tier column: "1".."3", "0" for early warnings.
std::string TierName(v1::Tier t);
// An incident title cut to 90 characters for one table row.
std::string RowTitle(const std::string& title);

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLI_SRC_COMMAND_OUTPUT_H_
