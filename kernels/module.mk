# kernels/: the math (codebooks, rotations, packing, codecs, attention).
# No I/O, no global mutable state; built into one static library.
KERNELS_SRC := $(wildcard kernels/*.c)
KERNELS_CU  := $(if $(filter 1,$(HAVE_CUDA)),$(wildcard kernels/*.cu))
KERNELS_OBJ := $(KERNELS_SRC:%.c=$(OBJ)/%.o) $(KERNELS_CU:%.cu=$(OBJ)/%.cu.o)
LIBTQK      := $(OBJ)/libtqkernels.a

$(LIBTQK): $(KERNELS_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && $(AR) rcs $@ $^
