# daemon/: the tqkvd process.
#
#   main.c      process: arguments, config, run-dir lock, signals, sd_notify, watchdog
#   config.c    the one option table: parsing (libinih), validation, reload, GetConfig
#   log.c       stderr logger (syslog prefixes under systemd, timestamps otherwise)
#   notify.c    sd_notify wrappers
#   tenant.c    tenants and per-tenant byte accounting (charge/uncharge)
#   session.c   the session table (refcounted, thread-safe; the data path's entry)
#   rpc.c       gRPC C-core control server (tqkv.v1.Control) and its handlers
#   idstore.c   the persistent session-id high-water mark (ids never repeat)
#   spill.c     the spill store: page slots in an O_DIRECT file, io_uring I/O thread
#   crc32c.c    the on-disk checksum (ISA-L)
#   persist.c   persistent sessions' files: manifests and journals (formats, I/O)
#   kvpersist.c persistent sessions over the page tables: journal, write-through,
#               checkpoints, recovery at start
#   backend_host.c, backend_cuda.c  where the pool lives: host DRAM; a CUDA
#               device's memory and the GPU kernels (kernels/tq_cuda.h)
#   reclaim.c   the reclaimer: watermarks, budgets under pressure, admission on a
#               full pool (wait, spill, pressure_action)
#
# Sources are listed, not globbed, so a module another engineer is still
# writing in daemon/ does not break this build: add a file here when it is
# ready to link.  DAEMON_OBJS is everything but main.o, for unit tests.
DAEMON_SRC  := daemon/main.c daemon/config.c daemon/log.c daemon/notify.c \
	daemon/tenant.c daemon/session.c daemon/rpc.c \
	daemon/backend_host.c daemon/backend_cuda.c daemon/pool.c daemon/dataop.c daemon/ring.c daemon/idstore.c \
	daemon/spill.c daemon/crc32c.c daemon/persist.c daemon/kvpersist.c daemon/reclaim.c
DAEMON_OBJS := $(filter-out $(OBJ)/daemon/main.o,$(DAEMON_SRC:%.c=$(OBJ)/%.o))
DAEMON_LIBS := $(GRPC_LIBS) $(PBC_LIBS) $(SD_LIBS) $(INIH_LIBS) $(NUMA_LIBS) $(URING_LIBS) $(ISAL_LIBS)
TQKVD       := $(BIN)/tqkvd

# rpc.c includes the generated header: generate it first on a clean -j build.
$(DAEMON_SRC:%.c=$(OBJ)/%.o): | $(PROTO_H)

$(TQKVD): $(OBJ)/daemon/main.o $(DAEMON_OBJS) $(PROTO_OBJ) $(LIBTQK) $(STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_LDFLAGS) -o $@ $(filter %.o %.a,$^) $(DAEMON_LIBS) $(LDLIBS_BASE)

ALL_TARGETS += $(TQKVD)

# Unit tests of the daemon's modules (recursive '=': CTL_OBJS comes later).
TEST_OBJS_test_config  = $(OBJ)/daemon/config.o $(OBJ)/daemon/log.o $(CTL_OBJS)
TEST_LIBS_test_config  = $(INIH_LIBS) $(CTL_LIBS)
TEST_OBJS_test_session = $(OBJ)/daemon/session.o $(OBJ)/daemon/idstore.o $(OBJ)/daemon/tenant.o $(OBJ)/daemon/config.o $(OBJ)/daemon/log.o
TEST_LIBS_test_session = $(INIH_LIBS)
TEST_OBJS_test_rpc     = $(DAEMON_OBJS) $(CTL_OBJS) $(OBJ)/tests/unit/devsim.o
TEST_LIBS_test_rpc     = $(DAEMON_LIBS)
TEST_OBJS_test_spill   = $(OBJ)/daemon/spill.o $(OBJ)/daemon/crc32c.o $(OBJ)/daemon/log.o
TEST_LIBS_test_spill   = $(URING_LIBS) $(ISAL_LIBS)
$(OBJ)/tests/unit/test_rpc.o: | $(PROTO_H)

# the data path (pool, ring server, operations): its unit tests
include daemon/datapath.mk
