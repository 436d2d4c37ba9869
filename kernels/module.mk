# kernels/: the math (codebooks, rotations, packing, codecs, attention).
# No I/O, no global mutable state; built into one static library.
#
# The GPU kernels (tq_cuda.h): with CUDA, tq_cuda.c (host side: devices,
# memory, contexts, checks, launches) and the .cu files; without it,
# tq_cuda_none.c, whose calls say the build has no CUDA.  The encoder's .cu
# is compiled with --fmad=false: its blocks must be the CPU reference's bytes,
# and the reference never fuses a multiply and an add.
ifeq ($(HAVE_CUDA),1)
  KERNELS_SRC := $(filter-out kernels/tq_cuda_none.c,$(wildcard kernels/*.c))
  KERNELS_CU  := $(wildcard kernels/*.cu)
else
  KERNELS_SRC := $(filter-out kernels/tq_cuda.c,$(wildcard kernels/*.c))
  KERNELS_CU  :=
endif
KERNELS_OBJ := $(KERNELS_SRC:%.c=$(OBJ)/%.o) $(KERNELS_CU:%.cu=$(OBJ)/%.cu.o)
LIBTQK      := $(OBJ)/libtqkernels.a

$(OBJ)/kernels/tq_cuda.o: EXTRA_CFLAGS += $(CUDA_CFLAGS)
$(OBJ)/kernels/tq_cuda_encode.cu.o: NVCC_FLAGS += --fmad=false

$(LIBTQK): $(KERNELS_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && $(AR) rcs $@ $^
