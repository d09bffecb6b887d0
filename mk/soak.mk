# The soak test (tests/soak.cpp, RELIABILITY.md "Soak"). Included by the top-level Makefile.
#
#   make soak   build shoal-soak and run it: SOAK_RANKS ranks x SOAK_OPS random ops (every
#               collective and send/recv, every dtype and reduce op, sizes up to SOAK_MAX_BYTES,
#               every algorithm, shm, tcp and two simulated hosts), each result checked; fails on a wrong result, RSS
#               growth, an fd or a /dev/shm segment leaked. Takes minutes.
#               ctest runs a short version (soak.short: 4 ranks x 1000 ops up to 1 MiB).

SOAK_RANKS ?= 4
SOAK_OPS ?= 10000
SOAK_SEED ?= 1
SOAK_MAX_BYTES ?= 16M
SOAK_CHECK_EVERY ?= 500
SOAK_ARGS ?=

.PHONY: soak

soak: build
	$(BUILD)/shoal-run -n $(SOAK_RANKS) $(BUILD)/shoal-soak --ops $(SOAK_OPS) --seed $(SOAK_SEED) \
	  --max-bytes $(SOAK_MAX_BYTES) --check-every $(SOAK_CHECK_EVERY) $(SOAK_ARGS)
