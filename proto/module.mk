# proto/: wire contracts (tqkv.proto → protobuf-c at build time; ring ABI header).
#
# protoc-c writes $(GEN)/tqkv.pb-c.{c,h}; generated files are never committed.
# Every object that includes tqkv.pb-c.h lists $(PROTO_H) as an order-only
# prerequisite (see daemon/ and client/ module.mk), so `make -j` from a clean
# tree generates the header first; after that the .d files track it.
PROTOC_C   ?= protoc-c
PROTO_SRC  := proto/tqkv.proto
PROTO_C    := $(GEN)/tqkv.pb-c.c
PROTO_H    := $(GEN)/tqkv.pb-c.h
PROTO_OBJ  := $(OBJ)/tqkv.pb-c.o

$(PROTO_C) $(PROTO_H) &: $(PROTO_SRC)
	@mkdir -p $(GEN)
	$(PROTOC_C) --proto_path=proto --c_out=$(GEN) $(PROTO_SRC)

$(PROTO_OBJ): $(PROTO_H)
