# tqkvd — a plain Makefile.
#
#   make                  build everything into build/ (binaries in build/bin/)
#   make test             install missing Debian packages, build, run every test
#   make run              build and start tqkvd in the foreground on the embedded defaults
#   make SANITIZER=address|undefined|address+undefined|thread
#                                             sanitized build (objects kept apart)
#   make USE_CUDA=auto|yes|no                 CUDA kernels (auto: when nvcc exists)
#   make install PREFIX=/usr DESTDIR=/tmp/pkg
#   make coverage [TESTS="..."]               the tests on a --coverage build: lines run per file
#   make phases                               build/bin/tqbench-phases: the GPU kernel's phase clocks
#
# Each folder adds its targets in its own module.mk; this file holds the rules.

PREFIX    ?= /usr/local
BINDIR    ?= $(PREFIX)/bin
SBINDIR   ?= $(PREFIX)/sbin
LIBDIR    ?= $(PREFIX)/lib
INCDIR    ?= $(PREFIX)/include
SYSCONFDIR ?= /etc
UNITDIR   ?= /lib/systemd/system
SYSUSERSDIR ?= /usr/lib/sysusers.d
DESTDIR   ?=

SANITIZER ?=
USE_CUDA  ?= auto
CUDA_HOME ?= /usr/local/cuda
CC        ?= cc
PKG_CONFIG ?= pkg-config

B := build
ARCH := $(shell uname -m)
OBJ := $(B)/obj$(if $(SANITIZER),-$(SANITIZER))
BIN := $(B)/bin
LIB := $(B)/lib
GEN := $(B)/gen

VERSION := $(shell cat VERSION 2>/dev/null || echo 0.0.0)
GIT_REV := $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)

# ---- flags -----------------------------------------------------------------
# -ffp-contract=off: no silent FMA contraction, so the scalar reference paths
# (codebooks, rotations, reference codec and attention) give the same bits on
# x86-64 and aarch64.  SIMD paths use explicit FMA intrinsics.
CFLAGS ?= -O2 -g
WARN   := -Wall -Wextra -Wshadow -Wformat=2 -Wno-unused-parameter -Wvla
BASE_CFLAGS := -std=gnu11 $(WARN) -ffp-contract=off -fno-strict-overflow \
	-D_GNU_SOURCE -pthread -fPIC -MMD -MP \
	-Ikernels -Iproto -Idaemon -Iclient/include -I$(GEN) \
	-DTQ_VERSION='"$(VERSION)"'
LDLIBS_BASE = $(CUDA_LIBS) -lm -pthread

# -fno-optimize-sibling-calls: every caller keeps its frame, so reports name
# it (and tests/tsan.supp can name one of ours that called into gRPC).
ifeq ($(SANITIZER),address)
  SAN_FLAGS := -fsanitize=address -fno-omit-frame-pointer -fno-optimize-sibling-calls
else ifeq ($(SANITIZER),undefined)
  SAN_FLAGS := -fsanitize=undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -fno-optimize-sibling-calls
else ifeq ($(SANITIZER),address+undefined)
  # both in one build (what .ci/run runs): each one's findings, one pass
  SAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -fno-optimize-sibling-calls
else ifeq ($(SANITIZER),thread)
  SAN_FLAGS := -fsanitize=thread -fno-omit-frame-pointer -fno-optimize-sibling-calls
else ifneq ($(SANITIZER),)
  $(error SANITIZER must be address, undefined, address+undefined or thread)
endif

ALL_CFLAGS  = $(BASE_CFLAGS) $(SAN_FLAGS) $(if $(SANITIZER),-DTQ_SANITIZER='"$(SANITIZER)"') $(CFLAGS) $(EXTRA_CFLAGS)
ALL_LDFLAGS = $(SAN_FLAGS) $(LDFLAGS)

# Per-ISA flags for the SIMD translation units (x86-64 only; elsewhere those
# files compile to nothing and the scalar paths are used).
ifeq ($(ARCH),x86_64)
  ISA_avx2   := -mavx2 -mfma -mf16c -mbmi2
  ISA_avx512 := -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx2 -mfma -mf16c -mbmi2
endif

# pkg-config: the packages are installed by scripts/install-deps.sh
pc = $(shell $(PKG_CONFIG) $(1) $(2) 2>/dev/null)
GRPC_CFLAGS := $(call pc,--cflags,grpc_unsecure)
GRPC_LIBS   := $(call pc,--libs,grpc_unsecure) -lgpr
PBC_CFLAGS  := $(call pc,--cflags,libprotobuf-c)
PBC_LIBS    := $(call pc,--libs,libprotobuf-c)
URING_LIBS  := $(call pc,--libs,liburing)
ISAL_LIBS   := $(call pc,--libs,libisal)
NUMA_LIBS   := $(call pc,--libs,numa)
SD_LIBS     := $(call pc,--libs,libsystemd)
INIH_CFLAGS := $(call pc,--cflags,inih)
INIH_LIBS   := $(call pc,--libs,inih)

# CUDA: the toolkit in CUDA_HOME — /usr/local/cuda when it has nvcc, else the
# NVIDIA wheels that scripts/install-cuda.sh (the deps step) put in build/cuda.
#   auto: build the GPU kernels when nvcc exists (not in sanitized builds: the
#         CUDA runtime and ASan's shadow memory do not mix);  yes: must;  no: never.
# The kernels are built for every GPU tqkvd targets (A100 sm_80, H100/H200
# sm_90, B200 sm_100, GB10 sm_121) as fatbin + PTX (PTX: later GPUs JIT it).
# The CUDA runtime is linked statically: a binary needs only the driver
# (libcuda.so.1) at run time, and runs without one (a GPU pool then fails or
# falls back, and says why).
# (CUDA_HOME from the environment is tried first, when it has nvcc.)
CUDA_HOME := $(firstword $(foreach d,$(CUDA_HOME) /usr/local/cuda $(CURDIR)/$(B)/cuda,$(if $(wildcard $(d)/bin/nvcc),$(d))))
NVCC := $(if $(CUDA_HOME),$(CUDA_HOME)/bin/nvcc,nvcc)
ifeq ($(USE_CUDA),auto)
  HAVE_CUDA := $(if $(SANITIZER),0,$(if $(wildcard $(NVCC)),1,0))
else ifeq ($(USE_CUDA),yes)
  HAVE_CUDA := 1
  ifeq ($(wildcard $(NVCC)),)
    $(error USE_CUDA=yes but no nvcc: install the CUDA toolkit at /usr/local/cuda, or run scripts/install-cuda.sh (the wheels, into build/cuda), or set CUDA_HOME)
  endif
else ifeq ($(USE_CUDA),no)
  HAVE_CUDA := 0
else
  $(error USE_CUDA must be auto, yes or no)
endif
CUDA_ARCHS ?= 80 90 100 121
# Machine code (SASS) for every architecture in CUDA_ARCHS, and the PTX of
# the last one compiled, for the driver to JIT on later GPUs.  sm_120 and
# sm_121 (GB10) are assembled from compute_100's PTX when sm_100 is built
# too: the kernels take the same source paths on all three (nothing tests
# __CUDA_ARCH__ beyond sm_90's bulk copies), ptxas gives them the same
# registers and spills either way (CUDA 13.0, -Xptxas -v), and one cicc
# pass fewer saves ~45 s of CPU on the attention kernels; compute_100's PTX
# also runs on every GPU from sm_100 up, where compute_121's runs on 12.1+.
comma := ,
CUDA_FROM_100 := $(if $(filter 100,$(CUDA_ARCHS)),$(filter 120 121,$(CUDA_ARCHS)))
CUDA_VIRT := $(filter-out $(CUDA_FROM_100),$(CUDA_ARCHS))
CUDA_GENCODE := $(foreach a,$(CUDA_VIRT),-gencode arch=compute_$(a),code=[sm_$(a)$(if \
	$(filter 100,$(a)),$(foreach b,$(CUDA_FROM_100),$(comma)sm_$(b)))$(if \
	$(filter $(a),$(lastword $(CUDA_VIRT))),$(comma)compute_$(a))])
CUDA_LIBDIR := $(firstword $(wildcard $(CUDA_HOME)/lib64/libcudart_static.a $(CUDA_HOME)/lib/libcudart_static.a))
NVCC_FLAGS ?= -O3 -g -std=c++17 -Xcompiler -fPIC,-Wall,-Wextra,-Wno-unused-parameter \
	-Werror all-warnings $(CUDA_GENCODE) -Ikernels -Iproto
# (expanded here: the stamp's flags are the global ones, not a target's own)
NVCC_ID := $(NVCC) $(NVCC_FLAGS)
ifeq ($(HAVE_CUDA),1)
  CUDA_CFLAGS := -I$(CUDA_HOME)/include -DTQ_HAVE_CUDA=1
  # -lstdc++: nvcc's host-side launch stubs use thread-safe statics
  # (__cxa_guard_*) and the C++ exception personality
  CUDA_LIBS   := -L$(dir $(CUDA_LIBDIR)) -lcudart_static -ldl -lrt -lstdc++
endif

# A build is one configuration.  Objects live in a directory per sanitizer
# and rebuild when their flags change ($(OBJ_STAMP)); binaries and libraries
# in build/bin, build/lib and build/tests are shared by all configurations
# and relink whenever the configuration differs from the last link ($(STAMP)).
CONFIG_ID := $(SANITIZER):$(HAVE_CUDA):$(CUDA_HOME):$(CFLAGS):$(EXTRA_CFLAGS)
STAMP     := $(B)/.config-link
OBJ_STAMP := $(OBJ)/.config
$(STAMP) $(OBJ_STAMP): FORCE
	@mkdir -p $(dir $@)
	@echo '$(CONFIG_ID)' | cmp -s - $@ || echo '$(CONFIG_ID)' > $@
# nvcc's objects also rebuild when its flags change (CUDA_ARCHS, NVCC_FLAGS;
# NVCC_ID)
NVCC_STAMP := $(OBJ)/.config-nvcc
$(NVCC_STAMP): FORCE
	@mkdir -p $(dir $@)
	@echo '$(NVCC_ID)' | cmp -s - $@ || echo '$(NVCC_ID)' > $@

# The git revision, for --version and Health: a generated header rewritten
# only when the revision changes, so a commit relinks just what prints it.
VERSION_H := $(GEN)/version.h
$(VERSION_H): FORCE
	@mkdir -p $(dir $@)
	@echo '#define TQ_GIT_REV "$(GIT_REV)"' | cmp -s - $@ || echo '#define TQ_GIT_REV "$(GIT_REV)"' > $@
$(OBJ)/daemon/main.o $(OBJ)/daemon/rpc.o $(OBJ)/client/tqctl.o: $(VERSION_H)

# ---- modules ---------------------------------------------------------------
ALL_TARGETS :=
TEST_PROGS  :=
include kernels/module.mk
include proto/module.mk
include daemon/module.mk
include client/module.mk
include tests/module.mk

.PHONY: all deps test test-faults soak run install clean demo coverage phases prefetch FORCE
.DEFAULT_GOAL := all
# nvcc's attention kernels first: four GPU architectures are the build's
# critical path (about 3 minutes of its 4 on a 2-core Zen 3), and the rest
# builds beside them
all: $(filter %/tq_cuda_attn.cu.o,$(KERNELS_OBJ)) $(ALL_TARGETS)

# ---- generic rules ---------------------------------------------------------
# Files named *_avx2.c / *_avx512.c are the SIMD paths; they get their ISA flags.
$(OBJ)/%_avx2.o:   ISA_FLAGS := $(ISA_avx2)
$(OBJ)/%_avx512.o: ISA_FLAGS := $(ISA_avx512)
$(OBJ)/%.o: %.c $(OBJ_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(ISA_FLAGS) -c $< -o $@

$(OBJ)/%.o: $(GEN)/%.c $(OBJ_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(PBC_CFLAGS) -Wno-shadow -c $< -o $@

# nvcc compiles a file's GPU architectures in NVCC_THREADS threads (the same
# code as one at a time: the attention kernels' four take ~215 s of CPU)
NVCC_THREADS ?= $(shell nproc 2>/dev/null || echo 2)
$(OBJ)/%.cu.o: %.cu $(OBJ_STAMP) $(NVCC_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -t $(NVCC_THREADS) -MMD -MP -c $< -o $@

deps:
	@scripts/install-deps.sh
	@scripts/install-cuda.sh

# the build on every CPU (nvcc's attention kernels take about three
# minutes of CPU, in NVCC_THREADS threads: the rest builds beside them),
# then the tests, as many at once as there are CPUs (tests/run.sh), but
# the chaos soak's short runs (TQ_NO_SOAK: .ci/run runs them after this)
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
test: deps
	@t0=$$(date +%s); $(MAKE) --no-print-directory -j$(JOBS) prefetch all && \
		echo "== the build: $$(( $$(date +%s) - t0 )) s"
	@TQ_NO_SOAK=1 $(MAKE) --no-print-directory check

# prefetch: what the tests download (the GGUF model, numpy and gguf for the
# reference scripts), beside the build — `make test` runs it first, so the
# downloads overlap the compilers instead of a test's slot.  Never fails:
# without a registry the tests that need them skip and say why.
prefetch:
	@mkdir -p $(B)
	@scripts/get-models.sh >/dev/null 2>$(B)/prefetch.log || tail -n 1 $(B)/prefetch.log
	@TQ_BUILD='$(abspath $(B))' scripts/py-venv.sh >/dev/null 2>>$(B)/prefetch.log || tail -n 1 $(B)/prefetch.log

# check: run the tests without the install step (used by `make test`)
# [TESTS="name ..."]: only the tests whose names contain one of these
check: $(ALL_TARGETS)
	@SANITIZER='$(SANITIZER)' BIN='$(BIN)' tests/run.sh $(TESTS)

# test-faults: the long runs — persistent sessions survive SIGKILL at a
# random moment, KILL_ROUNDS times (default 20; `make test` runs 3), and the
# memory-pressure model for MODEL_OPS random steps (default 1,000,000, about
# 70 s on a Zen 3 core; `make test` runs 300,000)
KILL_ROUNDS ?= 20
MODEL_OPS ?= 1000000
test-faults: deps
	@$(MAKE) --no-print-directory all
	@KILL_ROUNDS=$(KILL_ROUNDS) TQ_BIN='$(BIN)' bash tests/integration/persist.sh
	@TQ_MODEL_OPS=$(MODEL_OPS) TQ_TEST_ONLY=test_pressure_model $(B)/tests/test_pressure_model

# soak: the chaos soak (tests/soak/soak.sh): SOAK_CLIENTS clients against one
# tqkvd for SOAK_SECONDS while clients and the daemon are killed, sessions
# evicted and spilled, budgets changed and the config reloaded (good and
# broken); every attention result checked bit for bit.  `make test` runs
# 25 s with 4 clients (tests/integration/soak.sh).  SOAK_SEED=N repeats a run.
SOAK_SECONDS ?= 300
SOAK_CLIENTS ?= 8
soak: deps
	@$(MAKE) --no-print-directory all
	@SOAK_SECONDS=$(SOAK_SECONDS) SOAK_CLIENTS=$(SOAK_CLIENTS) $(if $(SOAK_SEED),SOAK_SEED=$(SOAK_SEED)) \
		TQ_BIN='$(abspath $(BIN))' TQ_BUILD='$(abspath $(B))' bash tests/soak/soak.sh

# coverage [TESTS="..."]: the tests on a --coverage build in $(B)/cov, then
# the lines run per file of daemon/, client/ and kernels/ (scripts/coverage.sh)
coverage: deps
	@B='$(B)' scripts/coverage.sh $(TESTS)

# demo: stories260K and SmolLM2 (chat) end to end through a private tqkvd (scripts/demo.sh)
demo: deps
	@$(MAKE) --no-print-directory $(TQKVD) $(TQKV_RUN)
	@BIN='$(BIN)' scripts/demo.sh
# run: the daemon in the foreground on the embedded defaults (sockets and
# lock in build/run/, spill files in build/spill/); `build/bin/tqctl health`
# from another shell answers.  RUN_ARGS passes options: RUN_ARGS='--config F'.
RUN_ARGS ?=
# (deps first, then a sub-make: pkg-config flags are read when make starts)
run: deps
	@$(MAKE) --no-print-directory -j$(JOBS) $(TQKVD) $(TQCTL)
	$(TQKVD) $(RUN_ARGS)

# install: binaries, the unit (paths filled in), sysusers.d entry and the
# annotated config (an existing config is kept).  Honours PREFIX and DESTDIR.
install: $(TQKVD) $(TQCTL)
	install -d $(DESTDIR)$(SBINDIR) $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) \
		$(DESTDIR)$(SYSUSERSDIR) $(DESTDIR)$(SYSCONFDIR)/tqkvd
	install -m 0755 $(TQKVD) $(DESTDIR)$(SBINDIR)/tqkvd
	install -m 0755 $(TQCTL) $(DESTDIR)$(BINDIR)/tqctl
	sed -e 's|@SBINDIR@|$(SBINDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' \
		systemd/tqkvd.service.in > $(DESTDIR)$(UNITDIR)/tqkvd.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/tqkvd.service
	install -m 0644 systemd/tqkvd.sysusers $(DESTDIR)$(SYSUSERSDIR)/tqkvd.conf
	@if [ -e $(DESTDIR)$(SYSCONFDIR)/tqkvd/tqkvd.conf ]; then \
		echo "keeping $(DESTDIR)$(SYSCONFDIR)/tqkvd/tqkvd.conf"; \
	else \
		install -m 0644 config/tqkvd.conf $(DESTDIR)$(SYSCONFDIR)/tqkvd/tqkvd.conf; \
	fi

clean:
	rm -rf $(B)

FORCE:

# keep objects made by chained pattern rules
.SECONDARY:

-include $(shell find $(B) -name '*.d' 2>/dev/null)
