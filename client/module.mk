# client/: libtqkv, tqctl, tqkv-run.
#
#   ctl.c     control-channel client: gRPC unary calls with protobuf-c
#             messages (tqctl now; libtqkv's session open/close next)
#   tqctl.c   the operator's command line
#
# Client sources are listed, not globbed: client/ also holds work in
# progress of others; add a file where its program is defined.  tqkv-run
# (the model runner: model, tokenizer, sampler, KV backends) is in client/run/.
CTL_OBJS  := $(OBJ)/client/ctl.o $(PROTO_OBJ)
CTL_LIBS  := $(GRPC_LIBS) $(PBC_LIBS)
TQCTL     := $(BIN)/tqctl

$(OBJ)/client/ctl.o $(OBJ)/client/tqctl.o: | $(PROTO_H)

$(TQCTL): $(OBJ)/client/tqctl.o $(CTL_OBJS) $(STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_LDFLAGS) -o $@ $(filter %.o %.a,$^) $(CTL_LIBS) $(LDLIBS_BASE)

ALL_TARGETS += $(TQCTL)

# libtqkv (static, shared, pkg-config) and tqbench's link of it
include client/libtqkv.mk

# ---- tqkv-run: a llama2.c model end to end (issue 6) ------------------------
# After libtqkv.mk: the tqkvd backend (kvback_daemon.c) links libtqkv.
TQKV_RUN_LIB_SRC := $(addprefix client/run/,model.c model_gguf.c gguf.c tokenizer.c tok_gguf.c bpe.c sampler.c kvback.c tqr_util.c)
TQKV_RUN_LIB_OBJ := $(TQKV_RUN_LIB_SRC:%.c=$(OBJ)/%.o)
TQKV_RUN         := $(BIN)/tqkv-run
$(TQKV_RUN): $(OBJ)/client/run/tqkv_run.o $(OBJ)/client/run/kvback_daemon.o $(TQKV_RUN_LIB_OBJ) $(LIBTQKV_A) $(LIBTQK) $(STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_LDFLAGS) -o $@ $(filter %.o %.a,$^) $(LIBTQKV_LIBS) $(LDLIBS_BASE)
ALL_TARGETS += $(TQKV_RUN)
TEST_OBJS_test_model := $(TQKV_RUN_LIB_OBJ)
$(OBJ)/tests/unit/test_model.o: ALL_CFLAGS += -Iclient/run
TEST_OBJS_test_bpe := $(TQKV_RUN_LIB_OBJ)
$(OBJ)/tests/unit/test_bpe.o: ALL_CFLAGS += -Iclient/run
TEST_OBJS_test_spm := $(TQKV_RUN_LIB_OBJ)
$(OBJ)/tests/unit/test_spm.o: ALL_CFLAGS += -Iclient/run
TEST_OBJS_test_gguf := $(TQKV_RUN_LIB_OBJ)
$(OBJ)/tests/unit/test_gguf.o: ALL_CFLAGS += -Iclient/run
