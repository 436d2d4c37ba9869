/* config.h — tqkvd's configuration: one option table drives parsing (INI
 * syntax through libinih), validation, --check-config, GetConfig and SIGHUP
 * reload.  config/tqkvd.conf documents every row of the table.
 *
 * A struct config is a plain value (no pointers): copy it with memcpy.
 * Nothing here logs; errors come back as text, one "file:line: message"
 * per line.  Not thread-safe by itself: the main thread owns the live
 * config and hands copies (or single values) to the others.
 */
#ifndef TQKVD_CONFIG_H
#define TQKVD_CONFIG_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CONFIG_MAX_TENANTS 64
#define CONFIG_MAX_IDS     32   /* uids (or gids) per tenant */
#define CONFIG_NAME_MAX    64   /* tenant names: [A-Za-z0-9_.-]{1,63} */
#define CONFIG_DIR_MAX     256
#define CONFIG_ERR_MAX     4096 /* room for all messages of one load */

/* Defaults for `make run` from the repository root. */
#define CONFIG_DEFAULT_RUN_DIR   "build/run"
#define CONFIG_DEFAULT_SPILL_DIR "build/spill"
#define CONFIG_DEFAULT_TENANT    "default"
#define CONFIG_CONTROL_SOCK      "control.sock"
#define CONFIG_LOCK_FILE         "tqkvd.lock"

struct tenant_conf {
	char name[CONFIG_NAME_MAX];
	uint64_t guaranteed;    /* bytes never taken away by pressure         */
	uint64_t limit;         /* bytes the tenant may hold at most          */
	int32_t priority;       /* 0..100; higher keeps its pages longer      */
	float sparse_v;         /* tq_attn_params.sparse_v of its sessions    */
	bool any_uid;           /* allow_uids = *                             */
	uint32_t n_uids, n_gids;
	uint32_t uids[CONFIG_MAX_IDS];
	uint32_t gids[CONFIG_MAX_IDS];
	int line;               /* of the [tenant NAME] header; 0 = embedded  */
	uint32_t set;           /* bit i: tenant option i was set in the file */
	int opt_line[8];        /* where each tenant option was set           */
};

/* pool.pressure_action: what a full pool does when nothing can be spilled. */
enum config_pressure_action {
	CONFIG_PRESSURE_FAIL = 0,   /* the allocation fails (POOL_FULL)                    */
	CONFIG_PRESSURE_EVICT = 1,  /* the lowest-priority over-guarantee session is evicted */
};

/* pool.backend: where the page pool's memory lives and its kernels run. */
enum config_backend {
	CONFIG_BACKEND_HOST = 0,    /* host DRAM (mmap, THP, NUMA); the CPU kernels         */
	CONFIG_BACKEND_CUDA = 1,    /* a CUDA device (pool.device); the GPU kernels         */
};

struct config {
	char path[CONFIG_DIR_MAX];           /* "" = embedded defaults */
	/* [daemon] */
	char run_dir[CONFIG_DIR_MAX];
	int log_level;                       /* LOG_ERR .. LOG_DEBUG */
	uint32_t control_tcp_port;           /* 0 = no TCP listener */
	char control_group[CONFIG_NAME_MAX]; /* "" = the daemon's group (both sockets) */
	char operator_group[CONFIG_NAME_MAX];/* "" = only root and the daemon's user */
	uint32_t max_sessions;
	uint32_t max_sessions_per_uid;
	uint64_t session_idle_ttl_ms;        /* 0 = never */
	uint32_t max_clients;                /* data connections at once */
	uint32_t max_clients_per_uid;
	uint64_t max_arena_per_uid;          /* ring memory one uid may map, all connections */
	uint32_t max_workers_per_uid;        /* data workers one uid's ops may hold at once (0: all) */
	uint32_t data_workers;               /* ring worker threads; 0 = one per CPU */
	uint32_t attention_threads;          /* threads per attention call (per worker) */
	uint32_t kv_transform;               /* TQ_XF_* of new sessions that name none */
	/* [pool] */
	uint64_t pool_bytes;
	char spill_dir[CONFIG_DIR_MAX];
	uint64_t page_bytes;                 /* pool page size */
	int32_t numa_node;                   /* -1 = no binding */
	bool allow_overcommit;               /* pool_bytes may exceed MemAvailable */
	uint64_t spill_bytes;                /* spill file capacity; 0 = 4 x pool_bytes */
	bool spill_fallback;                 /* pread/pwrite when io_uring/O_DIRECT fail */
	uint64_t checkpoint_interval_ms;     /* persistent sessions' checkpoints */
	uint32_t high_watermark;             /* % of the pool: the reclaimer starts above it */
	uint32_t low_watermark;              /* % of the pool: ... and stops at it */
	uint64_t admission_wait_ms;          /* an allocation waits this long for reclaim */
	int pressure_action;                 /* enum config_pressure_action */
	int backend;                         /* enum config_backend */
	uint32_t device;                     /* pool.device: the CUDA device index */
	bool backend_fallback;               /* cuda unusable: start on host memory */
	/* [tenant NAME] sections; the embedded "default" tenant when none */
	uint32_t n_tenants;
	struct tenant_conf tenant[CONFIG_MAX_TENANTS];
	int opt_line[48];                    /* where each option was set (indexed like the table) */
};

/* The embedded defaults: what tqkvd runs on without a config file. */
void config_defaults(struct config *c);

/* Defaults, then the file `path` (NULL: none), then validation.
 * 0, or -EINVAL / -ENOENT / -EACCES with every problem in err. */
int config_load(struct config *c, const char *path, char *err, size_t errlen);
/* The same for text in memory; `name` stands for the file in messages. */
int config_load_string(struct config *c, const char *name, const char *text,
		       char *err, size_t errlen);
/* Cross-option checks (bounds are checked while parsing). */
int config_validate(const struct config *c, char *err, size_t errlen);

/* Reload: copy the reloadable options of `next` into `live`.  Options
 * that cannot change at run time and differ are left as they are and
 * listed in `notes` (one per line) for the caller to log; `changes` (may
 * be NULL) gets one line per option changed, "name: old -> new".  A tenant
 * without a limit in the file gets the running pool's size (pool_bytes
 * takes a restart).  `next` must be valid; returns the number of options
 * changed. */
int config_apply_reload(struct config *live, const struct config *next,
			char *notes, size_t noteslen, char *changes, size_t changeslen);

const struct tenant_conf *config_tenant(const struct config *c, const char *name);

/* Visit every option (globals, then each tenant's) with its effective
 * value, default and whether it reloads.  Stops early when fn returns
 * non-zero and returns that value. */
typedef int (*config_visit_fn)(void *ctx, const char *key, const char *value,
			       const char *def, bool reloadable, const char *help);
int config_visit(const struct config *c, config_visit_fn fn, void *ctx);

/* Values in config syntax.  Sizes: an integer with an optional binary unit
 * K, M, G, T, P (each may be followed by "iB" or "B": 512M = 512MiB =
 * 512 * 2^20).  Durations: an integer with ms, s, m, h or d (plain: s). */
int config_parse_size(const char *s, uint64_t *out);
int config_parse_duration_ms(const char *s, uint64_t *out);
/* "1GiB" when exact in a binary unit, else the byte count. */
void config_format_size(uint64_t v, char *buf, size_t n);
/* "1.5 GiB": for tables (tqctl); 3 significant digits. */
void config_format_size_human(uint64_t v, char *buf, size_t n);
void config_format_duration_ms(uint64_t ms, char *buf, size_t n);
/* 0 if `name` is a valid tenant or session name. */
int config_check_name(const char *name);

/* The whole pages of page_bytes that `bytes` of a guarantee needs: pages
 * are charged whole, so guarantees are honoured (and must fit the pool's
 * floor(pool_bytes / page_bytes) pages) in whole pages. */
static inline uint64_t config_pages_ceil(uint64_t bytes, uint64_t page_bytes)
{
	return page_bytes ? bytes / page_bytes + (bytes % page_bytes != 0) : 0;
}

#endif
