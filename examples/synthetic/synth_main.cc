// trainwatch-synth: writes a synthetic run's metrics as CSV, for the demo,
// for trying thresholds with `twctl replay`, and for benchmarks.

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "synthetic.h"

int main(int argc, char** argv) {
  trainwatch::synth::Options o;
  bool demo = false;
  const char* out_path = nullptr;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "trainwatch-synth: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--demo") {
      demo = true;
    } else if (a == "--steps") {
      o.steps = std::atoll(next());
    } else if (a == "--seed") {
      o.seed = std::strtoull(next(), nullptr, 10);
    } else if (a == "--out") {
      out_path = next();
    } else {
      std::fprintf(stderr,
                   "usage: trainwatch-synth [--demo] [--steps N] [--seed S] [--out FILE]\n");
      return 2;
    }
  }
  if (demo) {
    const uint64_t seed = o.seed;
    o = trainwatch::synth::DemoOptions();
    o.seed = seed;
  }
  const std::string csv = trainwatch::synth::ToCsv(trainwatch::synth::Generate(o));
  FILE* f = out_path ? std::fopen(out_path, "wb") : stdout;
  if (f == nullptr) {
    std::perror(out_path);
    return 1;
  }
  const bool ok = std::fwrite(csv.data(), 1, csv.size(), f) == csv.size();
  if (out_path) std::fclose(f);
  return ok ? 0 : 1;
}
