/* main.c — the tqkvd process: arguments, configuration, the run-directory
 * lock, signals (signalfd), systemd notification and the watchdog.
 *
 * Threads: this main thread (signals, sd_notify, timers: watchdog, status,
 * idle sessions), the RPC thread and the control-socket acceptor (rpc.c),
 * and gRPC's own pollers.  Signals are blocked before any thread starts,
 * so they all inherit the mask and only the signalfd sees them.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "dataop.h"
#include "idstore.h"
#include "spill.h"
#include "kvpersist.h"
#include "log.h"
#include "notify.h"
#include "pool.h"
#include "reclaim.h"
#include "ring.h"
#include "rpc.h"
#include "session.h"
#include "tenant.h"
#include "tq_size.h"
#include "version.h"

#define EXIT_USAGE 2
#define DRAIN_MS 1000          /* SIGTERM: time given to in-flight calls */
#define TICK_MS 1000           /* idle sessions, STATUS= refresh */

struct daemon {
	const char *config_path;   /* NULL: embedded defaults */
	const char *run_dir_arg;   /* --run-dir */
	const char *spill_dir_arg; /* --spill-dir */
	struct config *cfg;        /* the live configuration (main thread) */
	int lock_fd;
	int spill_lock_fd;           /* spill_dir's lock (when not run_dir's) */
	int sig_fd;
	struct tenant_table *tenants;
	struct idstore *ids;       /* session ids never repeat (spill_dir/session-ids) */
	struct session_table *sessions;
	struct rpc_server *rpc;
	/* the data path: pool -> kvstore (page tables) -> ring server */
	struct pool *pool;
	tq_cache *codebooks;
	struct kvstore *kv;
	struct spill *spill;       /* the spill tier: spill_dir/spill.dat */
	struct reclaim *reclaim;   /* watermarks and admission on a full pool */
	struct ring_server *ring;
};

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: tqkvd [OPTIONS]\n"
		"\n"
		"The TurboQuant KV-cache daemon: owns this machine's KV-cache memory for LLM\n"
		"inference processes and keeps it compressed.  Serves the control API (gRPC,\n"
		"tqkv.v1.Control) at unix:RUN_DIR/control.sock; `tqctl` talks to it.\n"
		"\n"
		"Options:\n"
		"  -c, --config FILE     read FILE (INI; see config/tqkvd.conf for every option).\n"
		"                        Without it tqkvd runs on embedded defaults: run dir\n"
		"                        %s, spill dir %s, a 1 GiB pool, one\n"
		"                        tenant \"%s\" open to every user.\n"
		"  -r, --run-dir DIR     control socket and lock file here (overrides\n"
		"                        daemon.run_dir).  One tqkvd per run directory.\n"
		"  -s, --spill-dir DIR   spill files, persistent sessions and a lock file\n"
		"                        here (overrides pool.spill_dir).  One tqkvd per\n"
		"                        spill directory.\n"
		"      --check-config    load and validate the configuration, print the\n"
		"                        effective values, exit 0 if valid, 1 if not\n"
		"      --gpus            list the CUDA devices pool.backend = cuda can use\n"
		"                        (memory, bandwidth, device or unified memory), or\n"
		"                        say why there are none; exit 0 if any, 1 if none\n"
		"  -V, --version         print the version and exit\n"
		"  -h, --help            print this help and exit\n"
		"\n"
		"Signals: SIGTERM/SIGINT drain in-flight calls and exit 0; SIGHUP reloads the\n"
		"reloadable options (tenant budgets, priority, access and sparse_v,\n"
		"operator_group, log level, the max_* limits, session_idle_ttl, the pool's\n"
		"watermarks, admission_wait, pressure_action, checkpoint_interval,\n"
		"kv_transform; `tqctl config` says which option reloads).  Under systemd\n"
		"(Type=notify) it reports READY=1 once the control socket accepts calls,\n"
		"RELOADING=1, STOPPING=1, STATUS= and WATCHDOG=1.\n"
		"\n"
		"Exit status: 0 clean stop, 1 error (configuration, another instance, start-up;\n"
		"or the pool's GPU failed for good, which the log says: systemd's\n"
		"Restart=on-failure then starts tqkvd on a new GPU context), 2 bad usage.\n",
		CONFIG_DEFAULT_RUN_DIR, CONFIG_DEFAULT_SPILL_DIR, CONFIG_DEFAULT_TENANT);
}

/* mkdir -p with `mode` for the directories it creates. */
static int mkdir_p(const char *path, mode_t mode)
{
	char buf[CONFIG_DIR_MAX];
	size_t n = strlen(path);

	if (n == 0 || n >= sizeof(buf))
		return -ENAMETOOLONG;
	memcpy(buf, path, n + 1);
	for (size_t i = 1; i <= n; i++) {
		if (buf[i] != '/' && buf[i] != '\0')
			continue;
		char c = buf[i];
		buf[i] = '\0';
		if (mkdir(buf, mode) < 0 && errno != EEXIST)
			return -errno;
		buf[i] = c;
	}
	struct stat st;
	if (stat(path, &st) < 0)
		return -errno;
	return S_ISDIR(st.st_mode) ? 0 : -ENOTDIR;
}

/* One tqkvd per directory: flock on DIR/tqkvd.lock, which holds the pid.
 * RUN_DIR's is taken before any socket exists: gRPC (and our own
 * listener) unlink a socket file before binding, so without the lock a
 * second daemon would silently steal the first one's socket.
 * what: "running on" (run_dir) or "using the spill directory" (spill_dir:
 * spill.dat's slots, session-ids and sessions/ would be shared).  *out:
 * the descriptor (kept open while the daemon runs).  may_fail: a file
 * system without locks (ENOLCK, EOPNOTSUPP) is a warning, not an error. */
static int lock_dir(const char *dir, const char *what, bool may_fail, int *out)
{
	char path[CONFIG_DIR_MAX + 32], pid[32];
	int fd, r;

	*out = -1;
	snprintf(path, sizeof(path), "%s/%s", dir, CONFIG_LOCK_FILE);
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
	if (fd < 0) {
		struct stat st;
		r = -errno;
		if (r == -EACCES && stat(path, &st) == 0 && st.st_uid != geteuid())
			/* a run as another user (root's make run, say) left it */
			log_err("cannot open the lock file %s: %s: it belongs to uid %u and tqkvd runs as uid %u; "
				"give %s and its files to uid %u (chown -R), or remove what the other run left there",
				path, strerror(-r), (unsigned)st.st_uid, (unsigned)geteuid(), dir, (unsigned)geteuid());
		else
			log_err("cannot open the lock file %s: %s", path, strerror(-r));
		return r;
	}
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		r = -errno;
		if (errno == EWOULDBLOCK) {
			ssize_t k = pread(fd, pid, sizeof(pid) - 1, 0);
			pid[k > 0 ? k : 0] = '\0';
			pid[strcspn(pid, "\n")] = '\0';
			log_err("another tqkvd%s%s%s is %s %s (it holds %s); this one exits and leaves it alone",
				pid[0] ? " (pid " : "", pid, pid[0] ? ")" : "", what, dir, path);
		} else if (may_fail && (errno == ENOLCK || errno == EOPNOTSUPP)) {
			log_warning("cannot lock %s: %s; a second tqkvd %s %s would not be noticed", path,
				    strerror(errno), what, dir);
			close(fd);
			return 0;
		} else {
			log_err("cannot lock %s: %s", path, strerror(errno));
		}
		close(fd);
		return r;
	}
	int k = snprintf(pid, sizeof(pid), "%d\n", (int)getpid());
	if (ftruncate(fd, 0) < 0 || pwrite(fd, pid, (size_t)k, 0) != k)
		log_warning("cannot write the pid to %s: %s", path, strerror(errno));
	*out = fd;
	return 0;
}

/* spill_dir is run_dir itself? (then run_dir's lock covers it) */
static bool same_dir(const char *a, const char *b)
{
	struct stat sa, sb;

	return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

static void apply_overrides(struct daemon *d, struct config *c)
{
	if (d->run_dir_arg)
		snprintf(c->run_dir, sizeof(c->run_dir), "%s", d->run_dir_arg);
	if (d->spill_dir_arg)
		snprintf(c->spill_dir, sizeof(c->spill_dir), "%s", d->spill_dir_arg);
}

/* Each tenant's sparse-V, where it is on (at start and after each reload). */
static void note_sparse_v(struct daemon *d, const char *when)
{
	for (uint32_t i = 0; i < tenant_count(d->tenants); i++) {
		struct tenant *t = tenant_at(d->tenants, i);
		float sv = tenant_sparse_v(t);
		if (sv > 0.0f)
			log_info("%s: tenant '%s': sparse-V on: its sessions' attention (%s) skips values while at "
				 "most %g of each head's attention weight is left out", when, tenant_name(t),
				 pool_has_kernels(d->pool) ? "the GPU's kernels" : "the CPU's", (double)sv);
	}
}

/* Load, override, validate.  Logs every problem; returns 0 or -errno. */
static int load_config(struct daemon *d, struct config *c)
{
	char err[CONFIG_ERR_MAX];
	int r;

	r = config_load(c, d->config_path, err, sizeof(err));
	if (r == 0) {
		apply_overrides(d, c);
		r = config_validate(c, err, sizeof(err));
	}
	if (r < 0) {
		for (char *line = strtok(err, "\n"); line; line = strtok(NULL, "\n"))
			log_err("config: %s", line);
		if (!err[0])
			log_err("config: %s", strerror(-r));
	}
	return r;
}

static int print_entry(void *ctx, const char *key, const char *value, const char *def,
		       bool reloadable, const char *help)
{
	printf("%-34s = %-20s # default %s%s\n", key, value, def[0] ? def : "\"\"",
	       reloadable ? ", reloadable" : "");
	return 0;
}

static void status_line(struct daemon *d, char *buf, size_t n)
{
	struct session_stats ss;
	char used[32], pool[32];

	session_table_stats(d->sessions, &ss);
	config_format_size_human(tenant_table_used(d->tenants), used, sizeof(used));
	config_format_size_human(d->cfg->pool_bytes, pool, sizeof(pool));
	snprintf(buf, n, "%u sessions open, %u evicted; %s of %s used; %u tenants",
		 ss.open, ss.evicted, used, pool, tenant_count(d->tenants));
}

/* The stop's keeper.  A stop drains the data path (each running operation
 * may wait up to admission_wait for memory), the slow control calls, and
 * checkpoints every persistent session to disk, which can outlast the
 * unit's TimeoutStopSec (15 s) and end in a SIGKILL, the unit "failed" and
 * a replay at the next start.  While it runs, systemd is asked for
 * STOP_EXTEND_S more every STOP_EXTEND_S / 3 (EXTEND_TIMEOUT_USEC), for
 * STOP_EXTEND_MAX_S at most: a stop that hangs is still killed. */
#define STOP_EXTEND_S 15
#define STOP_EXTEND_MAX_S 600
static pthread_mutex_t stop_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t stop_cv; /* on CLOCK_MONOTONIC (stop_keeper_start) */
static bool stop_done;

static void *stop_keeper(void *arg)
{
	struct timespec t0, now;

	(void)arg;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	pthread_mutex_lock(&stop_mu);
	for (;;) {
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (stop_done || now.tv_sec - t0.tv_sec >= STOP_EXTEND_MAX_S)
			break;
		notify_extend_timeout((uint64_t)STOP_EXTEND_S * 1000000u);
		struct timespec until = now;
		until.tv_sec += STOP_EXTEND_S / 3;
		while (!stop_done && pthread_cond_timedwait(&stop_cv, &stop_mu, &until) == 0)
			;
	}
	pthread_mutex_unlock(&stop_mu);
	return NULL;
}

/* The keeper started (true), its condition on CLOCK_MONOTONIC: a wall
 * clock stepped back during the stop would otherwise stall the keeper's
 * sleep, and systemd would kill the stop it stopped extending. */
static bool stop_keeper_start(pthread_t *th)
{
	pthread_condattr_t ca;

	if (pthread_condattr_init(&ca) != 0)
		return false;
	bool ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 && pthread_cond_init(&stop_cv, &ca) == 0;
	pthread_condattr_destroy(&ca);
	if (ok && pthread_create(th, NULL, stop_keeper, NULL) != 0) {
		pthread_cond_destroy(&stop_cv);
		ok = false;
	}
	return ok;
}

/* A reload puts every tenant's budget back to the file's, those that
 * SetTenantBudget (tqctl budget set) changed at run time too: the file
 * compared with the last one says nothing of them, so each is logged here
 * (it was silent, "0 options changed").  How many.  Runs under rpc's
 * configuration lock (rpc_set_config's before), so no budget set in
 * between goes back unsaid. */
struct put_back {
	struct daemon *d;
	const struct config *merged; /* what runs next */
	const struct config *file;   /* the file as read: a tenant gone from it keeps its budget */
};

static int note_budgets_put_back(void *ctx)
{
	const struct put_back *pb = ctx;
	struct daemon *d = pb->d;
	char a[32], b[32];
	int n = 0;

	for (uint32_t i = 0; i < d->cfg->n_tenants; i++) {
		const struct tenant_conf *old = &d->cfg->tenant[i], *nw = config_tenant(pb->merged, old->name);
		struct tenant *t = tenant_find(d->tenants, old->name);
		struct tenant_info ti;
		if (!t || !nw || !config_tenant(pb->file, old->name))
			continue;
		tenant_get_info(t, &ti);
		const struct { const char *what; uint64_t run, was, file; } v[] = {
			{ "limit", ti.limit, old->limit, nw->limit },
			{ "guaranteed", ti.guaranteed, old->guaranteed, nw->guaranteed },
		};
		for (size_t k = 0; k < sizeof(v) / sizeof(v[0]); k++) {
			/* the file's already, or a change of the file's (logged
			 * with the file's other changes) */
			if (v[k].run == v[k].file || v[k].was != v[k].file)
				continue;
			config_format_size(v[k].run, a, sizeof(a));
			config_format_size(v[k].file, b, sizeof(b));
			log_notice("reload: tenant.%s.%s: %s (set at run time) -> %s (the file's)", old->name, v[k].what,
				   a, b);
			n++;
		}
	}
	return n;
}

static void reload(struct daemon *d)
{
	struct config *next = malloc(sizeof(*next));
	char notes[CONFIG_ERR_MAX], err[CONFIG_ERR_MAX], changes[CONFIG_ERR_MAX], status[256];
	int changed;

	notify_reloading();
	if (!next) {
		log_err("reload: out of memory; keeping the running configuration");
		goto done;
	}
	if (!d->config_path) {
		log_notice("reload: no config file (--config); nothing to reload");
		goto done;
	}
	log_notice("reload: reading %s", d->config_path);
	if (load_config(d, next) < 0) {
		log_err("reload: %s is not valid; keeping the running configuration", d->config_path);
		goto done;
	}
	/* Merge into a copy and validate that: budgets must still fit the
	 * pool the daemon actually runs with. */
	struct config *merged = malloc(sizeof(*merged));
	if (!merged) {
		log_err("reload: out of memory; keeping the running configuration");
		goto done;
	}
	memcpy(merged, d->cfg, sizeof(*merged));
	changed = config_apply_reload(merged, next, notes, sizeof(notes), changes, sizeof(changes));
	/* what stays as it runs first: a refusal below may be about it (a
	 * tenant gone from the file keeps its guarantee until a restart) */
	for (char *line = strtok(notes, "\n"); line; line = strtok(NULL, "\n"))
		log_warning("reload: %s", line);
	if (config_validate(merged, err, sizeof(err)) < 0) {
		for (char *line = strtok(err, "\n"); line; line = strtok(NULL, "\n"))
			log_err("reload: %s", line);
		log_err("reload: keeping the running configuration (what the file changes, %d option%s, is not "
			"applied)", changed, changed == 1 ? "" : "s");
		free(merged);
		goto done;
	}
	for (char *line = strtok(changes, "\n"); line; line = strtok(NULL, "\n"))
		log_notice("reload: %s", line);
	/* the tenants' budgets with GetConfig's copy, in one step (rpc.h),
	 * those set at run time and put back said first */
	struct put_back pb = { d, merged, next };
	changed += rpc_set_config(d->rpc, merged, note_budgets_put_back, &pb);
	memcpy(d->cfg, merged, sizeof(*merged));
	free(merged);
	log_set_level(d->cfg->log_level);
	note_sparse_v(d, "reload");
	session_table_set_max(d->sessions, d->cfg->max_sessions, d->cfg->max_sessions_per_uid);
	kvstore_persist_set_interval(d->kv, d->cfg->checkpoint_interval_ms);
	/* new watermarks, a lowered limit: the reclaimer acts at once */
	char why[256];
	if (reclaim_set_params(d->reclaim, &(struct reclaim_params){ d->cfg->high_watermark, d->cfg->low_watermark,
				d->cfg->admission_wait_ms, d->cfg->pressure_action }, why, sizeof(why)) < 0)
		log_err("reload: %s", why);
	ring_server_set_limits(d->ring, d->cfg->max_clients, d->cfg->max_clients_per_uid,
			       d->cfg->max_arena_per_uid);
	ring_server_set_worker_share(d->ring, d->cfg->max_workers_per_uid);
	log_notice("reload: done, %d option%s changed", changed, changed == 1 ? "" : "s");
done:
	free(next);
	status_line(d, status, sizeof(status));
	notify_ready(status);
}

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* MemAvailable from /proc/meminfo in bytes, or 0 when unknown. */
static uint64_t mem_available(void)
{
	FILE *f = fopen("/proc/meminfo", "re");
	char line[256];
	unsigned long long kb = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			break;
	fclose(f);
	return (uint64_t)kb << 10;
}

/* A pool the machine cannot back fails later, under load, when its pages
 * are touched (the OOM killer, or SIGBUS): refuse it now unless the
 * operator said otherwise. */
static int check_pool_fits(struct daemon *d)
{
	uint64_t avail = mem_available();
	char want[32], have[32];

	if (!avail) {
		log_warning("pool: cannot read MemAvailable from /proc/meminfo; not checking pool.pool_bytes "
			    "against the machine's memory");
		return 0;
	}
	config_format_size_human(d->cfg->pool_bytes, want, sizeof(want));
	config_format_size_human(avail, have, sizeof(have));
	if (d->cfg->pool_bytes > avail) {
		if (!d->cfg->allow_overcommit) {
			log_err("pool: pool.pool_bytes is %s but this machine has only %s available "
				"(MemAvailable): lower pool_bytes, or set pool.allow_overcommit = yes to start anyway",
				want, have);
			return -ENOMEM;
		}
		log_warning("pool: pool.pool_bytes %s exceeds the %s available (MemAvailable); starting "
			    "because pool.allow_overcommit = yes: allocations may fail under load", want, have);
	} else if (d->cfg->pool_bytes > avail / 10 * 9) {
		log_warning("pool: pool.pool_bytes %s is more than 90%% of the %s available (MemAvailable)",
			    want, have);
	}
	return 0;
}

/* The page pool and the page tables over it.  pool.backend = cuda: the
 * memory of CUDA device pool.device, and the GPU kernels; when there is no
 * usable GPU, start-up fails and says why — or, with pool.backend_fallback,
 * starts on host memory with the CPU kernels and says that. */
static int start_pool(struct daemon *d)
{
	struct pool_params pp = {
		.bytes = d->cfg->pool_bytes,
		.page_bytes = d->cfg->page_bytes <= POOL_PAGE_BYTES_MAX ? (uint32_t)d->cfg->page_bytes : 0,
		.numa_node = d->cfg->numa_node,
		.hugepages = true,
		.device = (int)d->cfg->device,
	};
	struct pool_stats ps;
	char why[512];
	int r;

	if (d->cfg->backend == CONFIG_BACKEND_CUDA) {
		pp.backend = &backend_cuda;
		/* a GPU sharing host memory pins the pool there (backend_cuda) */
		pp.host_avail = d->cfg->allow_overcommit ? 0 : mem_available();
		if ((r = pool_new(&d->pool, &pp, why, sizeof(why))) < 0) {
			if (!d->cfg->backend_fallback) {
				log_err("pool: pool.backend = cuda: %s (set pool.backend_fallback = yes to start "
					"on host memory with the CPU kernels instead)", why);
				return r;
			}
			log_warning("pool: pool.backend = cuda: %s; starting on host memory with the CPU "
				    "kernels instead (pool.backend_fallback = yes)", why);
			/* the CUDA context a failed start may have made holds
			 * device memory for nothing from here on */
			if (pp.backend->release) {
				pp.backend->release(pp.device);
				log_info("pool: CUDA device %d released (this process's context on it destroyed)",
					 pp.device);
			}
			pp.backend = &backend_host;
		}
	}
	if (!d->pool) {
		if ((r = check_pool_fits(d)) < 0)
			return r;
		if ((r = pool_new(&d->pool, &pp, why, sizeof(why))) < 0) {
			log_err("pool: %s", why);
			return r;
		}
	}
	if (!(d->codebooks = tq_cache_new()) || (r = kvstore_new(&d->kv, d->pool, d->codebooks)) < 0) {
		log_err("pool: out of memory");
		return -ENOMEM;
	}
	pool_stats(d->pool, &ps);
	if (pool_has_kernels(d->pool))
		log_info("pool: %u pages of %u KiB on %s; append and attention run there", ps.pages_total,
			 ps.page_bytes >> 10, ps.desc);
	else
		log_info("pool: %u pages of %u KiB (%s backend%s, NUMA node %d)", ps.pages_total,
			 ps.page_bytes >> 10, ps.backend, ps.hugepages ? ", transparent huge pages" : "",
			 ps.numa_node);
	return 0;
}

/* The spill store in spill_dir, sized pool.spill_bytes (0: 4 x pool). */
static int start_spill(struct daemon *d)
{
	uint64_t bytes = d->cfg->spill_bytes ? d->cfg->spill_bytes : 4 * d->cfg->pool_bytes;
	struct spill_params sp = {
		.dir = d->cfg->spill_dir,
		.bytes = bytes,
		.page_bytes = pool_page_bytes(d->pool),
		.allow_fallback = d->cfg->spill_fallback,
	};
	if (!pool_host_accessible(d->pool)) { /* a discrete GPU's pages: through pinned staging */
		sp.page_copy = pool_spill_copy;
		sp.pin_staging = pool_spill_pin;
		sp.unpin_staging = pool_spill_unpin;
		sp.copy_ctx = d->pool;
	}
	struct spill_stats st;
	char why[512], cap[32];
	int r;

	if ((r = spill_open(&d->spill, &sp, why, sizeof(why))) < 0) {
		log_err("spill: %s", why);
		return r;
	}
	kvstore_set_spill(d->kv, d->spill);
	/* test hook: a slow disk, for the tests of what it must not hold up */
	const char *delay = getenv("TQKVD_TEST_SPILL_DELAY_US");
	if (delay && atoi(delay) > 0) {
		spill_fault_delay(d->spill, (uint32_t)atoi(delay));
		log_warning("spill: TQKVD_TEST_SPILL_DELAY_US=%s: every spill I/O takes at least that long "
			    "(a test hook; unset it in production)", delay);
	}
	spill_stats(d->spill, &st);
	tq_size_format_human(st.slots_total * st.slot_bytes, cap, sizeof(cap));
	log_info("spill: %s, %" PRIu64 " page slots (%s), %s", spill_path(d->spill), st.slots_total, cap,
		 spill_engine(d->spill));
	return 0;
}

/* The data ring server on RUN_DIR/data.sock. */
static int start_ring(struct daemon *d)
{
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	struct ring_params rp = {
		.run_dir = d->cfg->run_dir,
		.n_workers = d->cfg->data_workers ? d->cfg->data_workers
			   : ncpu > 0 ? (uint32_t)(ncpu < 64 ? ncpu : 64) : 2,
		.attn_threads = d->cfg->attention_threads ? d->cfg->attention_threads : 1,
		.max_clients = d->cfg->max_clients,
		.max_clients_per_uid = d->cfg->max_clients_per_uid,
		.max_arena_per_uid = d->cfg->max_arena_per_uid,
		.max_workers_per_uid = d->cfg->max_workers_per_uid,
		.sock_gid = (gid_t)-1,
		.spin_us = 50,
	};
	char why[256];
	int r;

	if (d->cfg->control_group[0]) {
		struct group gr, *res = NULL;
		char buf[8192];
		if (getgrnam_r(d->cfg->control_group, &gr, buf, sizeof(buf), &res) != 0 || !res) {
			log_err("data server: daemon.control_group: unknown group '%s'", d->cfg->control_group);
			return -ENOENT;
		}
		rp.sock_gid = gr.gr_gid;
	}
	if ((r = ring_server_new(&d->ring, &rp, d->sessions, d->kv, why, sizeof(why))) < 0) {
		log_err("data server: %s", why);
		return r;
	}
	log_info("data server: unix:%s/%s, %u workers, at most %u clients (%u per uid)", d->cfg->run_dir,
		 TQKV_DATA_SOCK, rp.n_workers, rp.max_clients, rp.max_clients_per_uid);
	return 0;
}

/* Until SIGTERM/SIGINT.  Returns 0; 1 when the pool's device failed for
 * good (a CUDA context lost to a sticky error: no operation on the pool can
 * succeed again in this process, so it stops with a failure for its
 * supervisor to start it again); or -errno when the loop itself fails. */
static int run(struct daemon *d)
{
	uint64_t wd_period_ms = notify_watchdog_period_usec() / 1000;
	uint64_t next_wd = 0, next_tick = mono_ms() + TICK_MS;
	char status[256], last_status[256] = "";

	if (wd_period_ms)
		log_info("watchdog: keep-alive every %" PRIu64 " ms", wd_period_ms);
	for (;;) {
		uint64_t now = mono_ms();
		if (wd_period_ms && now >= next_wd) {
			notify_watchdog();
			next_wd = now + wd_period_ms;
		}
		if (now >= next_tick) {
			uint32_t n = session_table_expire(d->sessions, session_clock_ms(), d->cfg->session_idle_ttl_ms);
			if (n)
				log_info("idle timer: %u session%s evicted or dropped", n, n == 1 ? "" : "s");
			spill_check(d->spill);
			char why[512];
			if (pool_lost(d->pool, why, sizeof(why))) {
				log_err("%s", why);
				log_err("stopping with exit status 1, for systemd (Restart=on-failure) to start tqkvd "
					"on a new GPU context: persistent sessions come back from their files as of "
					"their last checkpoint and journal record; the other sessions' pages were on "
					"the device and are lost (operations since the failure were refused with "
					"DEVICE_LOST)");
				notify_status("the pool's GPU failed: stopping (see the log)");
				return 1;
			}
			status_line(d, status, sizeof(status));
			if (strcmp(status, last_status) != 0) {
				notify_status(status);
				memcpy(last_status, status, sizeof(status));
			}
			next_tick = now + TICK_MS;
		}
		uint64_t wake = next_tick;
		if (wd_period_ms && next_wd < wake)
			wake = next_wd;
		now = mono_ms();
		int timeout = wake > now ? (int)(wake - now) : 0;

		struct pollfd pf = { d->sig_fd, POLLIN, 0 };
		int r = poll(&pf, 1, timeout);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			r = -errno;
			log_err("poll: %s", strerror(errno));
			return r;
		}
		if (r == 0)
			continue;
		struct signalfd_siginfo si;
		if (read(d->sig_fd, &si, sizeof(si)) != (ssize_t)sizeof(si))
			continue;
		switch (si.ssi_signo) {
		case SIGHUP:
			reload(d);
			break;
		case SIGTERM:
		case SIGINT:
			log_notice("%s from pid %u: stopping", si.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT",
				   si.ssi_pid);
			return 0;
		default:
			break;
		}
	}
}

/* --gpus: what pool.backend = cuda would find. */
static int list_gpus(void)
{
	char why[512];
	int n = tqc_device_count(why, sizeof(why));

	if (n <= 0) {
		printf("no usable CUDA device: %s\n", n == 0 ? "the driver reports no device" : why);
		return 1;
	}
	for (int i = 0; i < n; i++) {
		struct tqc_device_info di;
		if (tqc_device_query(i, &di, why, sizeof(why)) < 0) {
			printf("device %d: %s\n", i, why);
			continue;
		}
		printf("device %d: %s, sm_%d%d, %d SMs, %.1f GiB (%.1f GiB free), %.0f GB/s peak, %s; "
		       "driver %d.%d, runtime %d.%d\n", i, di.name, di.cc_major, di.cc_minor, di.sms,
		       (double)di.total_bytes / (1 << 30), (double)di.free_bytes / (1 << 30), di.peak_gbps,
		       tqc_device_unified(&di) ? "unified memory (the pool is shared with the CPU, no copies)"
					       : "device memory (pages copied through pinned staging to spill)",
		       di.driver_version / 1000, di.driver_version % 1000 / 10, di.runtime_version / 1000,
		       di.runtime_version % 1000 / 10);
	}
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "run-dir", required_argument, NULL, 'r' },
		{ "spill-dir", required_argument, NULL, 's' },
		{ "check-config", no_argument, NULL, 'C' },
		{ "gpus", no_argument, NULL, 'G' },
		{ "version", no_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct daemon d = { .lock_fd = -1, .spill_lock_fd = -1, .sig_fd = -1 };
	bool check_only = false;
	char err[512], status[256];
	sigset_t mask;
	int opt, r, rc = 1;

	log_init();
	int info = 0; /* -h, --gpus or -V: print that and exit */
	while ((opt = getopt_long(argc, argv, "c:r:s:Vh", longopts, NULL)) != -1) {
		switch (opt) {
		case 'c': d.config_path = optarg; break;
		case 'r': d.run_dir_arg = optarg; break;
		case 's': d.spill_dir_arg = optarg; break;
		case 'C': check_only = true; break;
		/* acted on once the whole command line parsed: `tqkvd --gpus
		 * --bogus` is bad usage (2), not a device list */
		case 'G': info = info == 'h' ? 'h' : 'G'; break;
		case 'V': info = info ? info : 'V'; break;
		case 'h': info = 'h'; break;
		default:
			fprintf(stderr, "Try 'tqkvd --help'.\n");
			return EXIT_USAGE;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "tqkvd: unexpected argument '%s'\nTry 'tqkvd --help'.\n", argv[optind]);
		return EXIT_USAGE;
	}
	switch (info) { /* --help wins, then --gpus, then --version */
	case 'h':
		usage(stdout);
		return 0;
	case 'G':
		return list_gpus();
	case 'V':
		printf("tqkvd %s (git %s)\n", TQ_VERSION, TQ_GIT_REV);
		return 0;
	}

	d.cfg = malloc(sizeof(*d.cfg));
	if (!d.cfg) {
		log_err("out of memory");
		return 1;
	}
	if (load_config(&d, d.cfg) < 0)
		goto fail;
	if (check_only) {
		printf("# %s\n", d.config_path ? d.config_path : "embedded defaults (no --config)");
		config_visit(d.cfg, print_entry, NULL);
		fprintf(stderr, "tqkvd: configuration %s is valid\n", d.config_path ? d.config_path : "(defaults)");
		rc = 0;
		goto fail;
	}
	log_set_level(d.cfg->log_level);
	(void)session_clock_ms(); /* session times aligned with the wall clock now, before recovery */

	/* Block the signals before any thread exists; ignore SIGPIPE. */
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGHUP);
	if ((r = -pthread_sigmask(SIG_BLOCK, &mask, NULL)) < 0 ||
	    (d.sig_fd = signalfd(-1, &mask, SFD_CLOEXEC)) < 0) {
		log_err("signals: %s", strerror(r < 0 ? -r : errno));
		goto fail;
	}
	signal(SIGPIPE, SIG_IGN);

	if ((r = mkdir_p(d.cfg->run_dir, 0755)) < 0) {
		log_err("run directory %s: %s", d.cfg->run_dir, strerror(-r));
		goto fail;
	}
	if (lock_dir(d.cfg->run_dir, "running on", false, &d.lock_fd) < 0)
		goto fail;
	if ((r = mkdir_p(d.cfg->spill_dir, 0750)) < 0 || access(d.cfg->spill_dir, W_OK | X_OK) < 0) {
		log_err("spill directory %s: %s", d.cfg->spill_dir, strerror(r < 0 ? -r : errno));
		goto fail;
	}
	if (!same_dir(d.cfg->run_dir, d.cfg->spill_dir) &&
	    lock_dir(d.cfg->spill_dir, "using the spill directory", true, &d.spill_lock_fd) < 0)
		goto fail;
	if ((r = start_pool(&d)) < 0 || (r = start_spill(&d)) < 0)
		goto fail;
	if ((r = tenant_table_new(&d.tenants, d.cfg)) < 0 ||
	    (r = session_table_new(&d.sessions, d.cfg->max_sessions, kvstore_release, d.kv)) < 0) {
		log_err("start-up: %s", strerror(-r));
		goto fail;
	}
	session_table_set_max(d.sessions, d.cfg->max_sessions, d.cfg->max_sessions_per_uid);
	session_table_set_ending(d.sessions, kvstore_ending);
	note_sparse_v(&d, "start-up");
	{
		uint64_t first_id;
		if (idstore_open(&d.ids, d.cfg->spill_dir, &first_id, err, sizeof(err)) < 0) {
			log_err("session ids: %s", err);
			goto fail;
		}
		session_table_set_ids(d.sessions, first_id, idstore_reserve, d.ids);
		log_info("session ids continue at %" PRIu64 " (%s/%s)", first_id, d.cfg->spill_dir, IDSTORE_FILE);
		/* persistent sessions come back under their ids (below first_id
		 * unless session-ids was lost: then new ids go above them) */
		uint64_t max_id;
		if (kvstore_persist_open(d.kv, d.cfg->spill_dir, d.cfg->checkpoint_interval_ms, err, sizeof(err)) < 0) {
			log_err("persistent sessions: %s", err);
			goto fail;
		}
		r = 0;
		if (kvstore_recover(d.kv, d.sessions, d.tenants, &max_id) < 0 ||
		    (r = kvstore_persist_start(d.kv, d.sessions)) < 0) {
			log_err("persistent sessions: cannot start%s%s", r < 0 ? ": " : "", r < 0 ? strerror(-r) : "");
			goto fail;
		}
		if (max_id >= first_id)
			log_warning("persistent session ids reach %" PRIu64 ", beyond %s/%s: new ids continue above",
				    max_id, d.cfg->spill_dir, IDSTORE_FILE);
	}
	if ((r = reclaim_start(&d.reclaim, d.pool, d.tenants, d.sessions, d.kv, &(struct reclaim_params){
				       d.cfg->high_watermark, d.cfg->low_watermark, d.cfg->admission_wait_ms,
				       d.cfg->pressure_action }, err, sizeof(err))) < 0) {
		log_err("reclaim: %s", err);
		goto fail;
	}
	kvstore_set_reclaim(d.kv, d.reclaim);
	log_info("reclaim: spill above %u%% of the pool down to %u%%; allocations wait up to %" PRIu64 " ms; "
		 "nothing to spill: %s", d.cfg->high_watermark, d.cfg->low_watermark, d.cfg->admission_wait_ms,
		 d.cfg->pressure_action == CONFIG_PRESSURE_EVICT ? "evict" : "fail");
	if (rpc_start(&d.rpc, d.cfg, d.sessions, d.tenants, err, sizeof(err)) < 0) {
		log_err("control server: %s", err);
		goto fail;
	}
	if ((r = start_ring(&d)) < 0)
		goto fail;
	rpc_set_datapath(d.rpc, d.pool, d.ring);
	rpc_set_spill(d.rpc, d.spill, d.kv);
	rpc_set_reclaim(d.rpc, d.reclaim);
	status_line(&d, status, sizeof(status));
	log_notice("tqkvd %s ready: control unix:%s/%s%s, pool %s, spill %s, %u tenant%s, config %s",
		   TQ_VERSION, d.cfg->run_dir, CONFIG_CONTROL_SOCK,
		   d.cfg->control_tcp_port ? " and 127.0.0.1 (tcp)" : "",
		   (config_format_size(d.cfg->pool_bytes, err, sizeof(err)), err), d.cfg->spill_dir,
		   d.cfg->n_tenants, d.cfg->n_tenants == 1 ? "" : "s",
		   d.config_path ? d.config_path : "(embedded defaults)");
	notify_ready(status);

	if (run(&d) == 0)
		rc = 0;
	notify_stopping();
	pthread_t keeper;
	const bool keeping = stop_keeper_start(&keeper);
	/* data path first: running operations finish, queued ones are dropped,
	 * ephemeral sessions close; the control plane, still answering, lets
	 * go of the data server first (a GetStats or OpenSession of a data
	 * connection in flight finishes with it) */
	rpc_set_datapath(d.rpc, d.pool, NULL);
	ring_server_free(d.ring);
	d.ring = NULL;
	rpc_stop(d.rpc, DRAIN_MS);
	d.rpc = NULL;
	/* persistent sessions: everything to disk, then their files stay */
	kvstore_persist_stop(d.kv, d.sessions);
	if (keeping) {
		pthread_mutex_lock(&stop_mu);
		stop_done = true;
		pthread_cond_signal(&stop_cv);
		pthread_mutex_unlock(&stop_mu);
		pthread_join(keeper, NULL);
		pthread_cond_destroy(&stop_cv);
	}
	log_notice("stopped");
fail:
	if (d.rpc)
		rpc_set_datapath(d.rpc, d.pool, NULL);
	ring_server_free(d.ring);
	rpc_stop(d.rpc, 0);
	if (d.kv)
		kvstore_set_reclaim(d.kv, NULL);
	reclaim_stop(d.reclaim);
	if (d.kv)
		kvstore_persist_stop(d.kv, NULL); /* a failed start: persistent files stay */
	session_table_free(d.sessions);   /* runs kvstore_release for what is left */
	idstore_close(d.ids);
	kvstore_persist_close(d.kv);
	kvstore_free(d.kv);
	spill_close(d.spill);
	tq_cache_free(d.codebooks);
	pool_free(d.pool);
	tenant_table_free(d.tenants);
	if (d.sig_fd >= 0)
		close(d.sig_fd);
	if (d.lock_fd >= 0)
		close(d.lock_fd);
	if (d.spill_lock_fd >= 0)
		close(d.spill_lock_fd);
	free(d.cfg);
	return rc;
}
