// How the operator commands write what they got: -o json, the table cells
// several commands share, a failed call as an exit code and a message, and
// the one filter everything twctl prints passes through (TerminalSafe).

#ifndef TRAINWATCH_CLI_SRC_COMMAND_OUTPUT_H_
#define TRAINWATCH_CLI_SRC_COMMAND_OUTPUT_H_

#include <google/protobuf/message.h>
#include <grpcpp/support/status.h>

#include <string>

#include "absl/strings/string_view.h"
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
// "costs 0.778 GPU-hours: 700 steps x 2.000 s x 2 ranks, trained again".
std::string CostText(const v1::RollbackCost& cost);

// `text` with every character a terminal would act on written out as \u00XX:
// C0 controls but the newline (ESC, CR, backspace, tab...), DEL, C1
// controls (U+0080..U+009F, and the bytes 0x80..0x9F outside a valid UTF-8
// sequence, which an 8-bit terminal reads as C1). Run ids, titles, tensor
// and shard names, comments and log lines come from agents, which an
// operator does not control: "\x1b[2J" must not clear their screen. The
// \u00XX form is also JSON's escape, so -o json output stays valid JSON
// (whose writers escape C0 inside strings already) with the same meaning.
// CommandRegistry::Dispatch applies it to all a command writes: stdout,
// stderr, streamed lines and prompts.
std::string TerminalSafe(absl::string_view text);

}  // namespace trainwatch::cli

#endif  // TRAINWATCH_CLI_SRC_COMMAND_OUTPUT_H_
