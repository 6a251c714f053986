#include "command_output.h"

#include <google/protobuf/util/json_util.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "command.h"
#include "proto_text.h"

namespace trainwatch::cli {

std::string Json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.always_print_primitive_fields = true;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out + "\n";
}

namespace {

// What a refusal's gRPC code means to an operator.
const char* CodeWords(grpc::StatusCode code) {
  switch (code) {
    case grpc::INVALID_ARGUMENT: return "invalid request";
    case grpc::NOT_FOUND: return "not found";
    case grpc::ALREADY_EXISTS: return "already done";
    case grpc::FAILED_PRECONDITION: return "refused in this state";
    case grpc::ABORTED: return "aborted: try again";
    case grpc::PERMISSION_DENIED: return "not permitted for this token";
    case grpc::UNAUTHENTICATED: return "no valid token";
    case grpc::UNAVAILABLE: return "server unavailable";
    case grpc::DEADLINE_EXCEEDED: return "timed out";
    case grpc::RESOURCE_EXHAUSTED: return "server over its limits";
    case grpc::UNIMPLEMENTED: return "not supported by this server";
    default: return "server error";
  }
}

}  // namespace

int FromStatus(const grpc::Status& s, std::string* err) {
  if (s.ok()) return kOk;
  *err += absl::StrCat("twctl: ", s.error_message(), " (", CodeWords(s.error_code()), ")\n");
  if (s.error_code() == grpc::FAILED_PRECONDITION) return kRefused;
  if (s.error_code() == grpc::INVALID_ARGUMENT) return kUsage;
  return kError;
}

std::string Fmt(double v) {
  if (std::isnan(v)) return "nan";
  return absl::StrFormat("%.4g", v);
}

std::string TierName(v1::Tier t) { return std::to_string(TierNumber(t)); }

std::string RowTitle(const std::string& title) {
  return title.size() > 90 ? title.substr(0, 87) + "..." : title;
}

namespace {

// The length of the valid UTF-8 sequence starting at text[i] (2 to 4), 0
// when none starts there.
size_t Utf8SequenceLength(absl::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  const size_t n = lead >= 0xC2 && lead <= 0xDF   ? 2
                   : lead >= 0xE0 && lead <= 0xEF ? 3
                   : lead >= 0xF0 && lead <= 0xF4 ? 4
                                                  : 0;
  if (n == 0 || i + n > text.size()) return 0;
  for (size_t k = i + 1; k < i + n; ++k) {
    if ((byte(k) & 0xC0) != 0x80) return 0;
  }
  return n;
}

}  // namespace

std::string TerminalSafe(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      if ((c < 0x20 && c != '\n') || c == 0x7F) {
        absl::StrAppendFormat(&out, "\\u%04x", c);
      } else {
        out += static_cast<char>(c);
      }
      ++i;
      continue;
    }
    const size_t n = Utf8SequenceLength(text, i);
    if (n == 0) {
      absl::StrAppendFormat(&out, "\\u%04x", c);  // a stray byte, as Latin-1
      ++i;
    } else if (n == 2 && c == 0xC2 && static_cast<unsigned char>(text[i + 1]) < 0xA0) {
      absl::StrAppendFormat(&out, "\\u%04x", static_cast<unsigned char>(text[i + 1]));  // C1
      i += 2;
    } else {
      out.append(text.data() + i, n);
      i += n;
    }
  }
  return out;
}

std::string CostText(const v1::RollbackCost& cost) {
  return absl::StrFormat("costs %.3f GPU-hours: %d steps x %.3f s x %d ranks, trained again",
                         cost.gpu_hours(), cost.steps(), cost.step_seconds(), cost.ranks());
}

}  // namespace trainwatch::cli
