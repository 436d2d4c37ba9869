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

BENCH_SRCS := $(wildcard tests/bench/*.c)
BENCH_OBJS := $(BENCH_SRCS:%.c=$(OBJ)/%.o)
TQBENCH    := $(BIN)/tqbench
TQBENCH_OBJS ?=
TQBENCH_LIBS ?=
$(TQBENCH): $(BENCH_OBJS) $(TQBENCH_OBJS) $(LIBTQK) $(STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_LDFLAGS) -o $@ $(filter %.o %.a,$^) $(TQBENCH_LIBS) $(LDLIBS_BASE)

ALL_TARGETS += $(UNIT_BINS) $(TQBENCH)
