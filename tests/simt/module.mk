# tests/simt/: the GPU kernels' device code run on the CPU (x86-64 builds with
# CUDA): simt.{h,cpp} runs every CUDA thread of a block as a coroutine and
# checks that warp collectives and barriers converge; fake_cudart.cpp stands
# in for the CUDA runtime (one fake device, guard-paged device memory,
# streams that run at synchronization).  test_cuda_simt is the real
# tests/unit/test_cuda.c over the real host side (kernels/tq_cuda.c) and the
# real kernels (kernels/tq_cuda_*.cu, compiled as C++ with TQC_SIMT):
# tests/integration/cuda_simt.sh runs it on every `make test`, so the
# kernels' logic is checked where there is no GPU.  It says nothing about
# speed or the GPU's memory ordering: test_cuda on a GPU does.
ifeq ($(HAVE_CUDA)$(ARCH),1x86_64)
CXX ?= g++
SIMT_OBJ    := $(OBJ)/tests/simt
SIMT_BIN    := $(B)/tests/simt/test_cuda_simt
SIMT_LIBCUDA := $(B)/tests/simt/libcuda.so.1
SIMT_CXXFLAGS := -std=c++17 -O2 -g -ffp-contract=off -fno-fast-math -Wall -Wextra -Wno-unused-parameter \
	-Wno-unused-function -Wno-unknown-pragmas -Ikernels -Itests/simt -I$(CUDA_HOME)/include -MMD -MP
SIMT_OBJS := $(SIMT_OBJ)/simt.o $(SIMT_OBJ)/fake_cudart.o $(SIMT_OBJ)/sim_encode.o $(SIMT_OBJ)/sim_attn.o

$(SIMT_OBJ)/%.o: tests/simt/%.cpp $(OBJ_STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(SIMT_CXXFLAGS) -c $< -o $@

# the host side as the real build makes it, the kernels on the emulator
$(SIMT_BIN): $(OBJ)/tests/unit/test_cuda.o $(OBJ)/tests/unit/tietest.o $(HARNESS_OBJ) $(filter-out %.cu.o,$(KERNELS_OBJ)) $(SIMT_OBJS) $(STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(ALL_LDFLAGS) -o $@ $(filter %.o,$^) -ldl -lm -pthread

# the same with attn_mma's copy path of sm_80, sm_100 and sm_121 (cp.async
# in every lane) in place of the bulk copies: cuda_simt.sh runs its
# attention cases
SIMT_BIN_CPA := $(B)/tests/simt/test_cuda_simt_cpasync
$(SIMT_BIN_CPA): $(OBJ)/tests/unit/test_cuda.o $(OBJ)/tests/unit/tietest.o $(HARNESS_OBJ) $(filter-out %.cu.o,$(KERNELS_OBJ)) $(filter-out %/sim_attn.o,$(SIMT_OBJS)) $(SIMT_OBJ)/sim_attn_cpasync.o $(STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(ALL_LDFLAGS) -o $@ $(filter %.o,$^) -ldl -lm -pthread

# tqkvd itself on the emulator (a "GPU" pool whose kernels run here, the
# real tq_cuda.c and backend_cuda.c): gpu_backend.sh runs the data-path
# suite on it without a GPU, and device_lost.sh the device-lost path end
# to end (the fake runtime's TQ_FAKE_CUDA_FAULT=N makes the Nth work item
# fault).  The fake runtime is one lock: the daemon's threads take turns,
# and the emulated GPU runs one kernel at a time.
SIMT_TQKVD := $(B)/tests/simt/tqkvd-simt
$(SIMT_TQKVD): $(OBJ)/daemon/main.o $(DAEMON_OBJS) $(PROTO_OBJ) $(filter-out %.cu.o,$(KERNELS_OBJ)) $(SIMT_OBJS) $(STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(ALL_LDFLAGS) -o $@ $(filter %.o,$^) $(DAEMON_LIBS) $(filter-out $(CUDA_LIBS),$(LDLIBS_BASE)) -ldl -lm -pthread

# the emulator's own checks (cuda_simt.sh runs it first)
SIMT_SELFTEST := $(B)/tests/simt/simt_selftest
$(SIMT_SELFTEST): $(SIMT_OBJ)/simt.o $(SIMT_OBJ)/simt_selftest.o $(STAMP)
	@mkdir -p $(dir $@)
	$(CXX) $(ALL_LDFLAGS) -o $@ $(filter %.o,$^) -lm -pthread

# a libcuda.so.1 for tq_cuda.c's driver probe (dlopen) to find
$(SIMT_LIBCUDA):
	@mkdir -p $(dir $@)
	$(CC) -shared -o $@ -x c /dev/null

ALL_TARGETS += $(SIMT_BIN) $(SIMT_BIN_CPA) $(SIMT_LIBCUDA) $(SIMT_TQKVD) $(SIMT_SELFTEST)
endif
