# tests/: one small binary per module (tests/unit/test_*.c → build/tests/),
# integration scripts (tests/integration/*.sh) and the benchmark tqbench.
#
# A unit test links the kernels library; a test that needs more names it:
#   TEST_OBJS_test_foo := $(OBJ)/daemon/foo.o ...   TEST_LIBS_test_foo := -luring
.SECONDEXPANSION:
UNIT_SRCS := $(wildcard tests/unit/test_*.c)
UNIT_BINS := $(UNIT_SRCS:tests/unit/%.c=$(B)/tests/%)
HARNESS_OBJ := $(OBJ)/tests/unit/harness.o

$(B)/tests/%: $(OBJ)/tests/unit/%.o $(HARNESS_OBJ) $$(TEST_OBJS_$$*) $(LIBTQK) $(STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_LDFLAGS) -o $@ $(filter %.o %.a,$^) $(TEST_LIBS_$*) $(LDLIBS_BASE)

# the exact-tie inputs of the encoder tests (tietest.h)
TEST_OBJS_test_codec_simd := $(OBJ)/tests/unit/tietest.o
TEST_OBJS_test_cuda := $(OBJ)/tests/unit/tietest.o

BENCH_SRCS := $(wildcard tests/bench/*.c)
BENCH_OBJS := $(BENCH_SRCS:%.c=$(OBJ)/%.o)
TQBENCH    := $(BIN)/tqbench
TQBENCH_OBJS ?=
TQBENCH_LIBS ?=
$(TQBENCH): $(BENCH_OBJS) $(TQBENCH_OBJS) $(LIBTQK) $(STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_LDFLAGS) -o $@ $(filter %.o %.a,$^) $(TQBENCH_LIBS) $(LDLIBS_BASE)

ALL_TARGETS += $(UNIT_BINS) $(TQBENCH)

# what a call pays on a GPU outside its kernel (BENCHMARKS 2b): CUDA builds
ifeq ($(HAVE_CUDA),1)
$(B)/tests/launch_probe: $(OBJ)/tests/bench/launch_probe.cu.o $(STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_LDFLAGS) -o $@ $(filter %.o,$^) $(CUDA_LIBS) -lm -pthread
ALL_TARGETS += $(B)/tests/launch_probe

# a real device fault against tq_cuda.h's lost-device rule (exit 77 without
# a GPU; the emulator's twin is test_cuda test_device_lost); its one kernel
# as PTX alone, which any GPU compiles at load
$(OBJ)/tests/unit/test_cuda_fault.cu.o: NVCC_FLAGS := $(filter-out -gencode arch=%,$(NVCC_FLAGS)) \
	-gencode arch=compute_80,code=compute_80
$(B)/tests/test_cuda_fault: $(OBJ)/tests/unit/test_cuda_fault.cu.o $(LIBTQK) $(STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_LDFLAGS) -o $@ $(filter %.o %.a,$^) $(LDLIBS_BASE)
ALL_TARGETS += $(B)/tests/test_cuda_fault

# `make phases`: tqbench-phases, tqbench with the tiled kernel's phase
# clocks (TQC_PHASES; tq_cuda.h "profiling") for `tqbench attn --backend
# cuda --phases N`, kernels for PHASES_ARCHS only (default 90: H100 / H200;
# PTX for newer) — a profiling build for the GPU checks (scripts/gpu-check.sh
# phases; gpu-bundle.sh builds it).  Not in `all` (about 35 s of nvcc that
# `make test` would pay): .ci/run builds it after the tests, so that it
# never rots before a GPU lease, and the emulator's cp.async build runs the
# same instrumentation in `make test`.
PHASES_ARCHS ?= 90
TQBENCH_PH := $(BIN)/tqbench-phases
PHASES_OBJ := $(OBJ)/kernels/tq_cuda_attn_phases.cu.o
$(PHASES_OBJ): kernels/tq_cuda_attn.cu $(OBJ_STAMP) $(NVCC_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(filter-out -gencode arch=%,$(NVCC_FLAGS)) -t $(NVCC_THREADS) -DTQC_PHASES=1 \
		$(foreach a,$(PHASES_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
		-gencode arch=compute_$(lastword $(PHASES_ARCHS)),code=compute_$(lastword $(PHASES_ARCHS)) \
		-MMD -MP -c $< -o $@
# the phases object first: the library's own tq_cuda_attn.cu.o is not pulled
$(TQBENCH_PH): $(BENCH_OBJS) $(TQBENCH_OBJS) $(PHASES_OBJ) $(LIBTQK) $(STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_LDFLAGS) -o $@ $(filter %.o %.a,$^) $(TQBENCH_LIBS) $(LDLIBS_BASE)
phases: $(TQBENCH_PH)
else
phases:
	@echo "make phases: needs a build with CUDA (nvcc; make USE_CUDA=yes)" >&2; exit 2
endif

# ---- fuzz targets (tests/fuzz/fuzz_*.c, one per parser of untrusted bytes) --
# Regression build: each target linked with tests/fuzz/runner.c, which
# replays the seeds and mutations of them (tests/integration/fuzz.sh).
# `make fuzz [FUZZ_SECONDS=60]`: the same targets under libFuzzer (clang).
FUZZ_NAMES := config tokenizer checkpoint persist bpe gguf sqe rpc hello spillhdr xform
FUZZ_DEPS_config     = $(OBJ)/daemon/config.o $(OBJ)/daemon/log.o
FUZZ_LIBS_config     = $(INIH_LIBS)
FUZZ_SRCS_config     = daemon/config.c daemon/log.c
FUZZ_DEPS_tokenizer  = $(TQKV_RUN_LIB_OBJ)
FUZZ_SRCS_tokenizer  = $(TQKV_RUN_LIB_SRC)
FUZZ_DEPS_checkpoint = $(TQKV_RUN_LIB_OBJ)
FUZZ_SRCS_checkpoint = $(TQKV_RUN_LIB_SRC)
FUZZ_DEPS_bpe        = $(TQKV_RUN_LIB_OBJ)
FUZZ_SRCS_bpe        = $(TQKV_RUN_LIB_SRC)
FUZZ_DEPS_gguf       = $(TQKV_RUN_LIB_OBJ)
FUZZ_SRCS_gguf       = $(TQKV_RUN_LIB_SRC)
FUZZ_DEPS_persist    = $(OBJ)/daemon/persist.o $(OBJ)/daemon/crc32c.o $(OBJ)/daemon/config.o $(OBJ)/daemon/log.o
FUZZ_LIBS_persist    = $(ISAL_LIBS) $(INIH_LIBS)
FUZZ_SRCS_persist    = daemon/persist.c daemon/crc32c.c daemon/config.c daemon/log.c
# what a client or a disk sends the daemon: ring.c's and rpc.c's checks
# link the daemon's objects (ring.o reaches the whole data path)
FUZZ_DAEMON_SRCS     = $(filter-out daemon/main.c,$(DAEMON_SRC)) $(PROTO_C)
FUZZ_DEPS_sqe        = $(DAEMON_OBJS) $(PROTO_OBJ)
FUZZ_LIBS_sqe        = $(DAEMON_LIBS)
FUZZ_SRCS_sqe        = $(FUZZ_DAEMON_SRCS)
FUZZ_DEPS_rpc        = $(DAEMON_OBJS) $(PROTO_OBJ)
FUZZ_LIBS_rpc        = $(DAEMON_LIBS)
FUZZ_SRCS_rpc        = $(FUZZ_DAEMON_SRCS)
FUZZ_DEPS_hello      = $(DAEMON_OBJS) $(PROTO_OBJ)
FUZZ_LIBS_hello      = $(DAEMON_LIBS)
FUZZ_SRCS_hello      = $(FUZZ_DAEMON_SRCS)
FUZZ_DEPS_spillhdr   = $(OBJ)/daemon/spill.o $(OBJ)/daemon/crc32c.o $(OBJ)/daemon/log.o
FUZZ_LIBS_spillhdr   = $(URING_LIBS) $(ISAL_LIBS)
FUZZ_SRCS_spillhdr   = daemon/spill.c daemon/crc32c.c daemon/log.c
FUZZ_BINS := $(FUZZ_NAMES:%=$(B)/tests/fuzz_%)
FUZZ_CFLAGS = -Iclient/run -Itests/fuzz

$(OBJ)/tests/fuzz/%.o: ALL_CFLAGS += $(FUZZ_CFLAGS)
$(OBJ)/tests/fuzz/fuzz_rpc.o: ALL_CFLAGS += $(PBC_CFLAGS)
$(OBJ)/tests/fuzz/fuzz_rpc.o: | $(PROTO_H)
$(FUZZ_BINS): $(B)/tests/fuzz_%: $(OBJ)/tests/fuzz/fuzz_%.o $(OBJ)/tests/fuzz/runner.o \
		$(OBJ)/tests/fuzz/fuzz_util.o $$(FUZZ_DEPS_$$*) $(LIBTQK) $(STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_LDFLAGS) -o $@ $(filter %.o %.a,$^) $(FUZZ_LIBS_$*) $(LDLIBS_BASE)

ALL_TARGETS += $(FUZZ_BINS)

FUZZ_SECONDS ?= 60
FUZZ_CC ?= clang
FUZZ_ONLY ?= $(FUZZ_NAMES)
# one target: build it under libFuzzer, run it from its seeds (and the
# corpus it grew before) for FUZZ_SECONDS
define FUZZ_ONE
	@echo "fuzz: building $(1)"
	@$(FUZZ_CC) -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -std=gnu11 \
		-Ikernels -Iproto -Idaemon -Iclient/run -Iclient/include -I$(GEN) -Itests/fuzz $(PBC_CFLAGS) \
		-DTQ_VERSION='"$(VERSION)"' -o $(B)/fuzz/fuzz_$(1) tests/fuzz/fuzz_$(1).c \
		tests/fuzz/fuzz_util.c $(FUZZ_SRCS_$(1)) $(LIBTQK) $(FUZZ_LIBS_$(1)) $(LDLIBS_BASE)
	@mkdir -p $(B)/fuzz/corpus_$(1)
	@echo "fuzz: running $(1) for $(FUZZ_SECONDS) s"
	$(B)/fuzz/fuzz_$(1) -max_total_time=$(FUZZ_SECONDS) -max_len=65536 \
		$(B)/fuzz/corpus_$(1) tests/fuzz/seeds/$(1)

endef
.PHONY: fuzz
fuzz: $(LIBTQK) $(PROTO_H) $(VERSION_H)
	@mkdir -p $(B)/fuzz
	$(foreach t,$(FUZZ_ONLY),$(call FUZZ_ONE,$(t)))
include tests/simt/module.mk

# ---- the chaos soak (tests/soak/): tqsoak is the client soak.sh runs N of;
# `make soak SOAK_SECONDS=1800 SOAK_CLIENTS=8`, a short run in `make test`
# (tests/integration/soak.sh) --------------------------------------------------
TQSOAK := $(B)/tests/tqsoak
$(TQSOAK): $(OBJ)/tests/soak/tqsoak.o $(LIBTQKV_OBJS) $(LIBTQK) $(STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_LDFLAGS) -o $@ $(filter %.o %.a,$^) $(LIBTQKV_LIBS) $(LDLIBS_BASE)
ALL_TARGETS += $(TQSOAK)

# ---- libtqkv's binary interface (tests/abi/): a client linked against the
# shared library, calling the old symbol versions (libtqkv_abi.sh) ----------
TQKV_ABI := $(B)/tests/tqkv_abi
$(TQKV_ABI): $(OBJ)/tests/abi/tqkv_abi.o $(LIBTQKV_SO) $(STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_LDFLAGS) -o $@ $(OBJ)/tests/abi/tqkv_abi.o $(LIBTQKV_SO) \
		-Wl,-rpath,'$$ORIGIN/../lib' -lm
ALL_TARGETS += $(TQKV_ABI)
