# railhop: the two commands a user needs are `make demo` and `make test` (see README.md).
VENV      ?= .venv
BIN       := $(VENV)/bin
CBUILD    ?= build/ctest
C_SOURCES  = $(shell find plugin bpf -name '*.[ch]' -not -path '*/build/*')

.PHONY: setup test check demo image lint format-check typecheck ctest ctest-san ctest-tsan fuzz pytest clean

setup:
	@scripts/setup.sh

test: setup lint format-check typecheck ctest fuzz pytest

# The edit loop's answer, no VM (under 5 minutes on two cores): the C unit tests, the Python
# unit tests, and the plugin driven in NCCL's call order on an ASan build (closing as NCCL does,
# and exiting with everything open, as torch does: tests/privileged/test_nccl_order.py; root).
check: setup
	cmake -S . -B $(CBUILD) -G Ninja -DRAILHOP_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build $(CBUILD)
	ctest --test-dir $(CBUILD) --output-on-failure --timeout 300
	cmake -S . -B build/ctest-address -G Ninja -DRAILHOP_BUILD_TESTS=ON -DRAILHOP_SANITIZE=address \
		-DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build build/ctest-address --target nccl-net-railhop railhop-harness
	$(BIN)/python -m pytest -q tests/unit
	$(BIN)/python -m pytest -q tests/privileged/test_nccl_order.py -k "address and not fault"

demo: setup
	$(BIN)/railhop demo

# the railhop image from Debian packages (scripts/build-image.sh): localhost/railhop:<version>;
# its test: `.venv/bin/python -m pytest -m image tests/image` (run by .ci/run)
image: setup
	scripts/build-image.sh

lint: setup
	$(BIN)/ruff check agent lab tests bench
	$(BIN)/ruff format --check agent lab tests bench

format-check:
	clang-format --dry-run -Werror $(C_SOURCES)

typecheck: setup
	$(BIN)/mypy

ctest:
	cmake -S . -B $(CBUILD) -G Ninja -DRAILHOP_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build $(CBUILD)
	ctest --test-dir $(CBUILD) --output-on-failure --timeout 300
	$(MAKE) ctest-san SAN=address

# The C tests again in a sanitizer build (SAN=address: part of `make test`; SAN=thread:
# `make ctest-tsan`, about three minutes on two cores).
SAN ?= address
ctest-san:
	cmake -S . -B build/ctest-$(SAN) -G Ninja -DRAILHOP_BUILD_TESTS=ON -DRAILHOP_SANITIZE=$(SAN) \
		-DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build build/ctest-$(SAN)
	ctest --test-dir build/ctest-$(SAN) --output-on-failure --timeout 300

ctest-tsan:
	$(MAKE) ctest-san SAN=thread

# The libFuzzer targets of the decoders (plugin/fuzz, docs/fuzzing.md), built by clang in
# build/fuzz: every committed input replayed, then FUZZ_TIME seconds of fuzzing per target in a
# temp corpus; a crash fails with the path of its input. Under 2 minutes on two cores.
FUZZ_TIME ?= 15
fuzz:
	CC=clang cmake -S . -B build/fuzz -G Ninja -DRAILHOP_FUZZ=ON -DRAILHOP_BUILD_TESTS=OFF \
		-DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build build/fuzz --target fuzz_all -j 2
	plugin/fuzz/run.sh all build/fuzz/plugin/fuzz $(FUZZ_TIME)

pytest: setup
	$(BIN)/python -m pytest

clean:
	rm -rf build lab/build $(VENV) .pytest_cache .mypy_cache .ruff_cache
