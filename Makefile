# The README's two commands. Each installs what is missing (Debian packages),
# configures, builds and runs.
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython_EXECUTABLE=/usr/bin/python3

.PHONY: demo demo-replay test deps configure build bench package clean

# The end-to-end story: a PyTorch trainer, trainwatchd, Prometheus and
# Alertmanager on loopback (about a minute).
demo: build
	/usr/bin/python3 scripts/demo.py --build $(BUILD)

# The rule engine alone, replaying a synthetic 18,000-step run (seconds).
demo-replay: build
	BUILD=$(BUILD) scripts/demo-replay.sh

test: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

deps:
	@scripts/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j$(JOBS)

# The Debian package of trainwatchd and twctl, in $(BUILD)/package.
package: build
	cmake --build $(BUILD) --target package

bench: build
	$(BUILD)/bin/rule_engine_bench

clean:
	rm -rf $(BUILD)
