# The README's two commands. Each installs what is missing (Debian packages),
# configures, builds and runs.
BUILD ?= build
JOBS ?= 2
# -g1 (line tables and function names, no variable or type info): full -g
# cost about a fifth of every compile for nothing a test or perf report uses.
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython_EXECUTABLE=/usr/bin/python3 \
	'-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG'

.PHONY: demo demo-replay test check deps configure build bench package wheels clean sanitize fuzz

# The end-to-end story: a PyTorch trainer, trainwatchd, Prometheus and
# Alertmanager on loopback (about a minute).
demo: build
	/usr/bin/python3 scripts/demo.py --build $(BUILD)

# The rule engine alone, replaying a synthetic 18,000-step run (seconds).
demo-replay: build
	BUILD=$(BUILD) scripts/demo-replay.sh

test: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

# The unit tests alone (CTest label unit: no server, no subprocess), in
# under a minute once built.
check: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) -L '^unit$$'

deps:
	@scripts/install-deps.sh

# ccache when it is there (LAUNCHER, below): a fresh clone gains nothing from
# it, a second make test recompiles only what changed.
configure: deps
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS) $(LAUNCHER)

build: configure
	cmake --build $(BUILD) -j$(JOBS)

# Self-contained wheels for CPython 3.10 to 3.13 in dist/ (scripts/build_wheels.py),
# each then installed into a bare venv of its Python and used
# (tests/install/wheel_test.sh; make test does 3.11's), and the README's Python
# quick start run there with torch from the package index: torch-newest's pin,
# or torch-floor's for 3.10 (the newest has no wheel for it).
WHEEL_PYTHONS ?= 3.10 3.11 3.12 3.13
wheels: build
	/usr/bin/python3 scripts/build_wheels.py --build $(BUILD) --out dist \
		$(foreach v,$(WHEEL_PYTHONS),--python $(v))
	for v in $(WHEEL_PYTHONS); do \
		WHEEL_TEST_TORCH=$$(grep '^torch==' tests/python/env/torch-$$([ $$v = 3.10 ] && echo floor || echo newest).txt) \
		tests/install/wheel_test.sh $(CURDIR) dist $(BUILD)/wheels/env-repair/bin/python \
			$(CURDIR)/$(BUILD)/bin/trainwatchd $$(sed -n 's/^project(trainwatch VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt) $$v \
			|| exit 1; \
	done

# The Debian package of trainwatchd and twctl, in $(BUILD)/package.
package: build
	cmake --build $(BUILD) --target package

# Every benchmark (bench/run_all.py: rule engine, replay, CPU statistics
# against torch and a plain read, ingest side by side, agent overhead, and
# those others add), one table in $(BUILD)/bench/summary.{md,json} with the
# machine, the date and the commit, and the same figures as the documentation's
# page docs/benchmarks.md (about 10 minutes here).
bench: build
	/usr/bin/python3 bench/run_all.py --build $(BUILD)

# Every fuzz target (fuzz/) built with clang-14 in $(FUZZ_BUILD) and run for
# FUZZ_SECONDS each on its seed corpus; prints the executions per target. The
# folder is the one `make test`'s short run builds, so either reuses the other.
FUZZ_BUILD ?= $(BUILD)/fuzz-build
FUZZ_SECONDS ?= 60
fuzz: deps
	FUZZ_JOBS=$(JOBS) fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

# ccache when it is there: the main, sanitizer and fuzz builds are separate
# folders but their objects repeat from one run to the next.
LAUNCHER := $(if $(shell command -v ccache),-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)

# The unit and integration tests under ASan + UBSan, in their own folder (the
# main build is untouched). -O1 -g1 keeps the build and the tests quick with
# line numbers in reports; UBSan halts on its first finding, as ASan does. CUDA
# is off (nvcc takes no -fsanitize) and the benchmarks are not built. The
# Python binding is built (integration_test depends on it) but the tests that
# load it into python3 (the demo's trainer among them) or install packages are
# skipped: an ASan library cannot be loaded into Debian's python3 without
# preloading the runtime. So are the torch 2.x environments' tests: they
# run the wheel setup.py builds, not this build's code. The fuzz entry is skipped too: it builds its own
# clang folder (`make fuzz`). So is the replay speed case, a wall-clock budget
# that ASan's slowdown breaks (its code runs under ASan in the other cli cases
# and in replay_fuzz).
SANITIZE_BUILD ?= build-sanitize
SANITIZE_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
SANITIZE_SKIP := ^(python_|install_|readme_python|pyenv_|torch2_|trainers_|readme_torch2|readme_trainers|tensorboard_writers|detection_bench|demo_|fuzz_|e2e: the example trainer|replay speed)
sanitize: deps
	cmake -S . -B $(SANITIZE_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DPython_EXECUTABLE=/usr/bin/python3 $(LAUNCHER) \
	  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
	  -DCMAKE_CXX_FLAGS="$(SANITIZE_FLAGS)" \
	  -DCMAKE_EXE_LINKER_FLAGS="$(SANITIZE_FLAGS)" -DCMAKE_SHARED_LINKER_FLAGS="$(SANITIZE_FLAGS)" \
	  -DTRAINWATCH_WITH_CUDA=OFF -DTRAINWATCH_BUILD_BENCH=OFF -DTRAINWATCH_MALLOC=system
	cmake --build $(SANITIZE_BUILD) -j$(JOBS)
	cd $(SANITIZE_BUILD) && \
	  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1 \
	  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  LSAN_OPTIONS=suppressions=$(CURDIR)/scripts/lsan.supp:print_suppressions=0 \
	  ctest --output-on-failure -j$(JOBS) -E '$(SANITIZE_SKIP)'

clean:
	rm -rf $(BUILD)
