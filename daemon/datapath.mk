# The data path's unit tests (included from daemon/module.mk).
#
#   test_pool       pool + host backend: O(1) pages, all-or-nothing, stats
#   test_ring_abi   proto/tqkv_ring.h: layout, seeds, status strings
#   test_ring       ring server + workers + dataop + session/tenant modules
#                   in-process, clients forked with libtqkv (data channel):
#                   bit-exact against the kernels, concurrency, limits,
#                   hostile clients, SIGKILL cleanup
#   test_hostile    hostile clients (floods, arena rewritten or punched during
#                   operations, every cap) beside a well-behaved client held to
#                   a stated latency bound; client of hostile_*.sh
#   test_dataop     the operations alone: a huge ATTEND's memory, during and
#                   after; attention overflowing float range
#   test_pressure_model  budgets under pressure: 1 M random steps (open, append,
#                   attend, truncate, close, evict, spill, budget, reload, reclaim
#                   pass) on the real pool/tenants/sessions/spill/reclaimer,
#                   accounting, limits, guarantees and page bytes checked after
#                   each (TQ_MODEL_SEED, TQ_MODEL_OPS)
DATAPATH_OBJS := $(OBJ)/daemon/backend_host.o $(OBJ)/daemon/backend_cuda.o $(OBJ)/daemon/pool.o \
	$(OBJ)/daemon/dataop.o $(OBJ)/daemon/ring.o $(OBJ)/daemon/spill.o $(OBJ)/daemon/crc32c.o \
	$(OBJ)/daemon/persist.o $(OBJ)/daemon/kvpersist.o $(OBJ)/daemon/reclaim.o
TEST_OBJS_test_pool := $(OBJ)/daemon/backend_host.o $(OBJ)/daemon/backend_cuda.o $(OBJ)/daemon/pool.o
TEST_LIBS_test_pool := $(NUMA_LIBS)
TEST_OBJS_test_ring = $(OBJ)/tests/unit/ringfix.o $(OBJ)/tests/unit/devsim.o $(DATAPATH_OBJS) $(OBJ)/daemon/session.o $(OBJ)/daemon/tenant.o \
	$(OBJ)/daemon/config.o $(OBJ)/daemon/log.o $(LIBTQKV_OBJS)
TEST_LIBS_test_ring = $(NUMA_LIBS) $(INIH_LIBS) $(LIBTQKV_LIBS) $(URING_LIBS) $(ISAL_LIBS)
$(OBJ)/tests/unit/test_ring.o: | $(PROTO_H)
TEST_OBJS_test_dataop = $(DATAPATH_OBJS) $(OBJ)/daemon/session.o $(OBJ)/daemon/tenant.o \
	$(OBJ)/daemon/config.o $(OBJ)/daemon/log.o
TEST_LIBS_test_dataop = $(NUMA_LIBS) $(INIH_LIBS) $(URING_LIBS) $(ISAL_LIBS)
TEST_OBJS_test_residency = $(OBJ)/tests/unit/kvfix.o $(OBJ)/tests/unit/devsim.o $(DATAPATH_OBJS) $(OBJ)/daemon/session.o $(OBJ)/daemon/tenant.o \
	$(OBJ)/daemon/config.o $(OBJ)/daemon/log.o
TEST_LIBS_test_residency = $(NUMA_LIBS) $(INIH_LIBS) $(URING_LIBS) $(ISAL_LIBS)
# tqbench spill runs the pool, page tables and spill store in-process
TQBENCH_OBJS += $(DATAPATH_OBJS) $(OBJ)/daemon/session.o $(OBJ)/daemon/tenant.o \
	$(OBJ)/daemon/config.o $(OBJ)/daemon/log.o
TQBENCH_LIBS += $(NUMA_LIBS) $(INIH_LIBS) $(URING_LIBS) $(ISAL_LIBS)
# test_persist: persist.c's formats, persistent sessions restarted in-process
# (kvfix: transforms' statistics survive); also the client of
# tests/integration/persist.sh
TEST_OBJS_test_persist = $(OBJ)/tests/unit/kvfix.o $(OBJ)/tests/unit/devsim.o $(DATAPATH_OBJS) $(OBJ)/daemon/session.o \
	$(OBJ)/daemon/tenant.o $(OBJ)/daemon/config.o $(OBJ)/daemon/log.o $(LIBTQKV_OBJS)
TEST_LIBS_test_persist = $(NUMA_LIBS) $(INIH_LIBS) $(LIBTQKV_LIBS) $(URING_LIBS) $(ISAL_LIBS)
$(OBJ)/tests/unit/test_persist.o: | $(PROTO_H)
# test_reclaim: the reclaimer's policy on the real pool, tenants, sessions, spill
TEST_OBJS_test_reclaim = $(OBJ)/tests/unit/kvfix.o $(OBJ)/tests/unit/devsim.o $(DATAPATH_OBJS) $(OBJ)/daemon/session.o $(OBJ)/daemon/tenant.o \
	$(OBJ)/daemon/config.o $(OBJ)/daemon/log.o
TEST_LIBS_test_reclaim = $(NUMA_LIBS) $(INIH_LIBS) $(URING_LIBS) $(ISAL_LIBS)
# test_pressure_model: the randomized model of budgets under pressure (white-box: dataop_internal.h)
TEST_OBJS_test_pressure_model = $(OBJ)/tests/unit/kvfix.o $(OBJ)/tests/unit/devsim.o $(DATAPATH_OBJS) $(OBJ)/daemon/session.o \
	$(OBJ)/daemon/tenant.o $(OBJ)/daemon/config.o $(OBJ)/daemon/log.o
TEST_LIBS_test_pressure_model = $(NUMA_LIBS) $(INIH_LIBS) $(URING_LIBS) $(ISAL_LIBS)
# test_hostile: hostile clients next to a well-behaved one (issue 14 item 3);
# also the client of tests/integration/hostile_*.sh
TEST_OBJS_test_hostile = $(OBJ)/tests/unit/ringfix.o $(DATAPATH_OBJS) $(OBJ)/daemon/session.o $(OBJ)/daemon/tenant.o \
	$(OBJ)/daemon/config.o $(OBJ)/daemon/log.o $(LIBTQKV_OBJS)
TEST_LIBS_test_hostile = $(NUMA_LIBS) $(INIH_LIBS) $(LIBTQKV_LIBS) $(URING_LIBS) $(ISAL_LIBS)
$(OBJ)/tests/unit/test_hostile.o $(OBJ)/tests/unit/ringfix.o: | $(PROTO_H)
