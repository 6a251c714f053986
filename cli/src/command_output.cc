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

int FromStatus(const grpc::Status& s, std::string* err) {
  if (s.ok()) return kOk;
  *err += absl::StrCat("twctl: ", s.error_message(), " (", s.error_code(), ")\n");
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

}  // namespace trainwatch::cli
