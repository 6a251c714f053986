// Lets the tools take their flags spelled with dashes (--ranks-per-run) as
// well as with underscores (--ranks_per_run, the Abseil spelling).

#ifndef TRAINWATCH_BENCH_INGEST_FLAG_NAMES_H_
#define TRAINWATCH_BENCH_INGEST_FLAG_NAMES_H_

#include <string>
#include <vector>

namespace trainwatch::bench {

// Returns argv with every "--some-flag[=v]" whose underscore spelling is a
// registered Abseil flag rewritten to "--some_flag[=v]". The value that
// follows a non-boolean flag given without "=" is never rewritten, and
// nothing after a bare "--" is. Call before absl::ParseCommandLine, and keep
// the result alive while the pointers into it are used.
std::vector<std::string> NormalizeFlagNames(int argc, char** argv);

// Pointers into `args`, for a main() that wants argc/argv back.
std::vector<char*> ArgvOf(std::vector<std::string>& args);

}  // namespace trainwatch::bench

#endif  // TRAINWATCH_BENCH_INGEST_FLAG_NAMES_H_
