#include "pager/http_poster.h"

#include <curl/curl.h>

#include "absl/strings/str_cat.h"

namespace trainwatch::server {

namespace {

size_t Append(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

}  // namespace

CurlPoster::CurlPoster() { curl_global_init(CURL_GLOBAL_DEFAULT); }

absl::StatusOr<HttpResponse> CurlPoster::Post(const std::string& url, const Headers& headers,
                                              const std::string& body, absl::Duration timeout) {
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return absl::InternalError("curl_easy_init failed");
  curl_slist* list = nullptr;
  for (const auto& [name, value] : headers) {
    list = curl_slist_append(list, absl::StrCat(name, ": ", value).c_str());
  }
  HttpResponse response;
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, list);
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(absl::ToInt64Milliseconds(timeout)));
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);  // the sender is not the main thread
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, Append);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &response.body);
  const CURLcode rc = curl_easy_perform(curl);
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(list);
  curl_easy_cleanup(curl);
  if (rc == CURLE_OPERATION_TIMEDOUT) return absl::DeadlineExceededError(curl_easy_strerror(rc));
  if (rc != CURLE_OK) return absl::UnavailableError(curl_easy_strerror(rc));
  response.status = static_cast<int>(status);
  return response;
}

HttpPoster* DefaultHttpPoster() {
  static HttpPoster* const poster = new CurlPoster();
  return poster;
}

}  // namespace trainwatch::server
