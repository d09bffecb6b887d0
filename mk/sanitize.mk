# Sanitizer builds of the C++ suite, and the libFuzzer targets. Included by the top-level Makefile.
#
#   make asan        configure + build into build/asan with AddressSanitizer + UndefinedBehavior-
#                    Sanitizer (UB aborts: -fno-sanitize-recover), run the whole ctest suite there,
#                    then a short soak: part of `make test`
#   make tsan        the same into build/tsan with ThreadSanitizer
#   make fuzz        build the libFuzzer targets (tests/fuzz/*.cpp, clang) into build/fuzz and run
#                    each for FUZZ_SECONDS (default 300) from its seed corpus
#   make fuzz-smoke  the same for FUZZ_SMOKE_SECONDS (default 5) each
#
# Every process the tests spawn (forked rank processes, shoal-run and what it execs) inherits the
# *SAN_OPTIONS below, so a report in a child makes it exit with a non-zero code (or die on a
# signal), which fails its test. Suppressions, each with its reason: tests/tsan.supp,
# tests/ubsan.supp.

SAN_JOBS ?= $(JOBS)
SAN_BUILD_TYPE ?= RelWithDebInfo
SAN_CTEST_ARGS ?=
ASAN_BUILD ?= $(BUILD)/asan
TSAN_BUILD ?= $(BUILD)/tsan
FUZZ_BUILD ?= $(BUILD)/fuzz
FUZZ_SECONDS ?= 300
FUZZ_SMOKE_SECONDS ?= 5
# Debian 12's clang is clang 14; libFuzzer's runtime (-fsanitize=fuzzer) is in libclang-rt-14-dev.
FUZZ_CXX ?= clang++
FUZZ_TARGETS := $(patsubst tests/fuzz/%.cpp,%,$(wildcard tests/fuzz/*.cpp))
SAN_APT_PACKAGES := clang libclang-rt-14-dev

ASAN_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
TSAN_FLAGS := -fsanitize=thread -fno-omit-frame-pointer

# exitcode 66/67/68: a sanitizer's report, told apart from a test's own failures. Set only for
# these targets (and what they run); one already in the environment wins.
SAN_TARGETS := asan tsan asan-build tsan-build fuzz fuzz-smoke
$(SAN_TARGETS): export ASAN_OPTIONS ?= halt_on_error=1:exitcode=66:detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1:print_summary=1
$(SAN_TARGETS): export UBSAN_OPTIONS ?= halt_on_error=1:exitcode=67:print_stacktrace=1:report_error_type=1:suppressions=$(CURDIR)/tests/ubsan.supp
$(SAN_TARGETS): export TSAN_OPTIONS ?= halt_on_error=1:exitcode=68:second_deadlock_stack=1:history_size=4:suppressions=$(CURDIR)/tests/tsan.supp

.PHONY: asan tsan asan-build tsan-build fuzz fuzz-smoke fuzz-build san-deps

san-deps:
	@missing=""; for p in $(SAN_APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $$missing; \
	fi

# ASan + UBSan: g++ -O1 -g1 (half the compile CPU of -O2 -g; -g1 keeps file:line in reports; gcc
# 12 at -O1 warns falsely in <regex>). With the tests' reference arithmetic left uninstrumented
# (SHOAL_TEST_REFERENCE, tests/harness.h) the whole suite takes ~3.5 min on 2 cores, the build
# ~1.5 min (RELIABILITY.md, "Sanitizers"). (clang would build faster still, but clang 14 rejects
# __builtin_cpu_supports("f16c") in src/reduce/reduce.cpp.) Then a short soak at 4 ranks (every op
# and algorithm in its warm-up, then random ones up to 256 KiB, shm, tcp and simulated hosts; its
# RSS bound is loosened, since ASan's quarantine holds on to freed memory).
ASAN_CXX ?= g++
ASAN_OPT ?= -O1 -g1 -Wno-maybe-uninitialized
# The tests' own sources are built with ASan but without UBSan: UBSan's checks on the tests' code
# (not the library's) doubled their compile time, which was half of the build.
ASAN_TESTS_FLAGS ?= -fno-sanitize=undefined
# Left out: the two store tests that fork while the parent's store server thread runs. gcc 12's
# libasan does not lock its allocator across fork(), so a child can inherit a lock the server
# thread held and hang in its first allocation (seen: 1 run in ~90; gdb: the child waits in
# SizeClassAllocator64::GetFromAllocator from TcpStore::Impl::read_frame). `make test` runs them
# in the plain build, `make tsan` under ThreadSanitizer.
# Also left out: the simd_* reruns at forced kernel levels (every level's kernels run under ASan
# in the kernel tests themselves); soak.short (the ASan soak below runs the same program); and
# the collective matrix's repeats of one code path at other world sizes: under ASan it runs every
# family, algorithm, dtype and size at n1, n2, n3, n5 over shm, n4 over tcp, and on the host
# layout 0_0_1_1_1_2 (uneven hosts); the plain build runs all 147 cases. Likewise the p2p ring
# and the direct algorithms' slot reuse run at odd world sizes (and 8 for the slots) only
# (RELIABILITY.md, "Sanitizers"). `make asan ASAN_EXCLUDE='^simd_'` runs them all.
ASAN_EXCLUDE ?= ^Stores/StoreTest\.(GetBlocksUntilAnotherProcessSets|AddFromSeveralProcesses)/|^simd_|^soak\.short$$|Matrix/(n1_tcp|n2_tcp|n3_tcp|n4_shm|n5_tcp|n8_shm|n8_tcp|hosts_0_0_1_1|hosts_0_1_0_1_0|hosts_0_0_0_0_1_1_1_1)_[a-z_]+$$|P2PRing\.Exchanges/n[248]_|DirectReuse\.[A-Za-z]+/n[24]$$
ASAN_SOAK ?= --ops 1000 --max-bytes 256K --check-every 250 --seed 7 --rss-limit-mib 1024

asan-build: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_CXX_COMPILER=$(ASAN_CXX) -DCMAKE_BUILD_TYPE=Debug \
	  -DCMAKE_CXX_FLAGS_DEBUG="$(ASAN_OPT)" -DCMAKE_CXX_FLAGS="$(ASAN_FLAGS)" \
	  -DSHOAL_TESTS_CXX_FLAGS="$(ASAN_TESTS_FLAGS)" >/dev/null
	cmake --build $(ASAN_BUILD) -j$(SAN_JOBS)

asan: asan-build
	cd $(ASAN_BUILD) && ctest --output-on-failure --timeout 600 -j$(CTEST_JOBS) -E '$(ASAN_EXCLUDE)' $(SAN_CTEST_ARGS)
	@echo "== soak under ASan: shoal-soak $(ASAN_SOAK)"
	@$(ASAN_BUILD)/shoal-run -n 4 $(ASAN_BUILD)/shoal-soak $(ASAN_SOAK) > $(ASAN_BUILD)/soak.log 2>&1 \
	  || { tail -n 60 $(ASAN_BUILD)/soak.log; echo "soak: FAILED (log: $(ASAN_BUILD)/soak.log)"; exit 1; }
	@tail -n 1 $(ASAN_BUILD)/soak.log

tsan-build: deps
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=$(SAN_BUILD_TYPE) -DCMAKE_CXX_FLAGS="$(TSAN_FLAGS)" >/dev/null
	cmake --build $(TSAN_BUILD) -j$(SAN_JOBS)

tsan: tsan-build
	cd $(TSAN_BUILD) && ctest --output-on-failure --timeout 900 -j$(SAN_JOBS) $(SAN_CTEST_ARGS)

# ---- libFuzzer ---------------------------------------------------------------------------------
# Each tests/fuzz/<target>.cpp is linked with the few library sources it reaches (instrumented for
# coverage, ASan and UBSan). Seeds: tests/fuzz/corpus/<target>/ (read-only); what the fuzzer
# learns goes to $(FUZZ_BUILD)/corpus/<target>/, crashes to $(FUZZ_BUILD)/crash-<target>-*.
# Limits make unbounded allocation (-malloc_limit_mb: any single allocation above it, -rss_limit_mb)
# and hangs (-timeout: seconds per input) findings, like crashes. ASan's quarantine of freed memory
# is cut to 64 MiB (default 256) so that it does not eat most of the RSS limit.
FUZZ_LIMITS ?= -rss_limit_mb=512 -malloc_limit_mb=256 -timeout=5
FUZZ_CXXFLAGS := -std=c++20 -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined \
  -fno-sanitize-recover=undefined -Iinclude -Isrc -MMD -MP
FUZZ_LIB_SOURCES := src/store/tcp_store.cpp src/store/tcp_store_server.cpp src/store/tcp_store_wire.cpp \
  src/transport/tcp_link.cpp src/transport/tcp_connect.cpp src/transport/tcp_accept.cpp src/transport/tcp_dial.cpp \
  src/transport/tcp_socket.cpp \
  src/transport/net_address.cpp src/base/log.cpp src/base/params.cpp
FUZZ_LIB_OBJS := $(FUZZ_LIB_SOURCES:%.cpp=$(FUZZ_BUILD)/obj/%.o)
FUZZ_BINS := $(FUZZ_TARGETS:%=$(FUZZ_BUILD)/bin/%)

$(FUZZ_BUILD)/obj/%.o: %.cpp | san-deps
	@mkdir -p $(@D)
	$(FUZZ_CXX) $(FUZZ_CXXFLAGS) -c $< -o $@

$(FUZZ_BUILD)/bin/%: $(FUZZ_BUILD)/obj/tests/fuzz/%.o $(FUZZ_LIB_OBJS)
	@mkdir -p $(@D)
	$(FUZZ_CXX) -fsanitize=fuzzer,address,undefined $^ -o $@ -lpthread

.SECONDARY: $(FUZZ_LIB_OBJS) $(FUZZ_TARGETS:%=$(FUZZ_BUILD)/obj/tests/fuzz/%.o)  # keep: rebuild only what changed

-include $(wildcard $(FUZZ_BUILD)/obj/*/*.d $(FUZZ_BUILD)/obj/*/*/*.d)

fuzz-build: $(FUZZ_BINS)

# $(1): seconds per target.
define run_fuzzers
	@set -e; for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(FUZZ_BUILD)/corpus/$$t; \
	  echo "== fuzz $$t for $(1) s"; \
	  ASAN_OPTIONS="$$ASAN_OPTIONS:quarantine_size_mb=64" $(FUZZ_BUILD)/bin/$$t -max_total_time=$(1) $(FUZZ_LIMITS) -print_final_stats=1 \
	    -artifact_prefix=$(FUZZ_BUILD)/crash-$$t- $(FUZZ_BUILD)/corpus/$$t tests/fuzz/corpus/$$t \
	    > $(FUZZ_BUILD)/$$t.log 2>&1 || { tail -n 60 $(FUZZ_BUILD)/$$t.log; echo "fuzz $$t: FAILED (log: $(FUZZ_BUILD)/$$t.log)"; exit 1; }; \
	  grep -E '^(Done|stat::number_of_executed_units|stat::peak_rss_mb)' $(FUZZ_BUILD)/$$t.log | tr '\n' ' '; echo; \
	done
endef

fuzz: fuzz-build
	$(call run_fuzzers,$(FUZZ_SECONDS))

fuzz-smoke: fuzz-build
	$(call run_fuzzers,$(FUZZ_SMOKE_SECONDS))

# `make test` (Makefile) builds these while its plain suites run, then runs the fuzz smoke (4
# targets x 5 s) and the suite under ASan + UBSan (UBSan off in the tests' own sources).
