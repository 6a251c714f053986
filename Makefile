# The README's two commands. Each installs what is missing (Debian packages),
# configures, builds and runs.
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython_EXECUTABLE=/usr/bin/python3

.PHONY: demo test deps configure build bench clean

demo: build
	BUILD=$(BUILD) scripts/demo.sh

test: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

deps:
	@scripts/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j$(JOBS)

bench: build
	$(BUILD)/bin/rule_engine_bench

clean:
	rm -rf $(BUILD)
