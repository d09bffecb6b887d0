# shoal: `make demo` runs the main job end to end, `make test` runs every test.
# Both set everything up on a fresh machine first (Debian packages, .venv, the build).

BUILD ?= build
JOBS ?= 2
# ctest runs one test more than there are cores: many tests spend their time waiting (timeouts,
# sleeps, ranks starting), and a third slot overlaps those waits: the C++ suite took 178 s at -j2
# and 152-158 s at -j3 on our 2 cores (RELIABILITY.md, "Time of `make test`").
CTEST_JOBS ?= 3
PY := .venv/bin/python
# Gloo and Open MPI are the peers shoal-bench measures shoal against (--vs gloo, --vs ompi).
APT_PACKAGES := cmake g++ make ccache libgloo-dev libgtest-dev libgmock-dev iproute2 iperf3 openmpi-bin libopenmpi-dev
# ccache lets the wheel's build (python-install) reuse the library's objects from `build`: the same
# sources with the same flags, compiled in another directory (so the directory is left out of the
# hash: CCACHE_NOHASHDIR) and named alike ($(CXX): c++ and g++ hash apart). The launcher is looked
# up when a recipe runs, after deps installed it.
CCACHE_ENV = CCACHE_DIR=$(CURDIR)/$(BUILD)/ccache CCACHE_NOHASHDIR=1
LAUNCHER = $$(command -v ccache)

.PHONY: all setup deps venv build setup-and-build test demo bench clean

all: build

deps: .deps-stamp
.deps-stamp: Makefile
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $$missing; \
	fi
	@touch $@

venv: .venv/.stamp
.venv/.stamp: requirements-dev.txt
	python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	@touch $@

setup: deps venv

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=$(CXX) -DCMAKE_CXX_COMPILER_LAUNCHER=$(LAUNCHER) >/dev/null
	$(CCACHE_ENV) cmake --build $(BUILD) -j$(JOBS)

# The Python environment is made while the Debian packages install and the C++ build compiles:
# pip spends most of its time unpacking wheels, apt fetching and unpacking packages, and two cores
# build about as fast beside them. (venv needs none of the packages: python3 -m venv and pip.)
setup-and-build:
	$(MAKE) -j2 venv build

# `make test`: the sanitizer and fuzzer builds (mk/sanitize.mk) compile at nice 19 while the plain
# build's suites run (ctest, then the Python package and pytest), taking the CPU the tests leave
# (ranks and Ray actors starting, timeouts); then the fuzz smoke and the suite under ASan. The
# suites beside the builds slow by less than the builds take alone (RELIABILITY.md, "Time of
# `make test`"). A failed suite stops the builds.
SAN_BUILD_LOG = $(BUILD)/san-builds.log
test: setup-and-build
	@setsid -w nice -n 19 $(MAKE) --no-print-directory fuzz-build asan-build > $(SAN_BUILD_LOG) 2>&1 & builds=$$!; \
	echo "== sanitizer and fuzzer builds at nice 19 beside the tests (log: $(SAN_BUILD_LOG))"; \
	stop_builds() { kill -TERM -- -$$builds 2>/dev/null; }; \
	(cd $(BUILD) && ctest --output-on-failure --timeout 600 -j$(CTEST_JOBS)) || { stop_builds; exit 1; }; \
	$(MAKE) test-python || { stop_builds; exit 1; }; \
	echo "== waiting for the sanitizer and fuzzer builds"; \
	wait $$builds || { tail -n 60 $(SAN_BUILD_LOG); echo "sanitizer or fuzzer build: FAILED (log: $(SAN_BUILD_LOG))"; exit 1; }
	$(MAKE) fuzz-smoke asan

demo: setup build python-install
	@for op in allreduce allgather broadcast; do \
	  $(BUILD)/shoal-bench $$op -n 4 -b 4K -e 16M -f 16 --check --vs gloo || exit 1; echo; \
	done
	$(PY) -m shoal.demo -n 4 --backends shoal,gloo --epochs 20
	@echo
	$(PY) -m shoal.bench --backends shoal,gloo --ops all_reduce,all_gather,broadcast,reduce_scatter,all_to_all \
	  -n 4 -b 4K -e 16M -f 16 --ddp
	@echo
	$(PY) -m shoal.ray.demo --workers 4 --world 8 --size 8388608

include mk/python.mk
include mk/sanitize.mk
include mk/soak.mk

clean:
	rm -rf $(BUILD) .deps-stamp
