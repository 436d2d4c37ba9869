#!/usr/bin/env bash
# Every tqctl command against a real tqkvd: tables, --json, exit codes
# (0 ok, 1 error, 2 usage), --help per command, and bad requests.
. "$(dirname "$0")/lib/daemon.bash"

cat >"$T/tqkvd.conf" <<CONF
[pool]
pool_bytes = 512M
[tenant default]
limit = 256M
allow_uids = *
[tenant locked]
limit = 64M
allow_uids = 4242
CONF
start_daemon --config "$T/tqkvd.conf"
wait_up

expect() { # expect RC CMD...: run tqctl, check its exit code, keep its output
	local want=$1; shift
	OUT=$(ctl "$@" 2>&1); local rc=$?
	[ "$rc" = "$want" ] || fail "tqctl $*: exit $rc, expected $want: $OUT"
}
has() { grep -q -- "$1" <<<"$OUT" || fail "output of the last command lacks '$1': $OUT"; }
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)" <<<"$OUT" || fail "bad JSON: $OUT"; }

expect 0 health;                 has '^SERVING: tqkvd'
expect 0 health --json;          [ "$(json 'd["status"]')" = SERVING ] || fail "health --json"
expect 0 stats;                  has 'pool: .*512 MiB'
has "^spill: .* used of 2.00 GiB ($T/spill/spill.dat; io_uring"
has '^reclaim: *watermarks 90%/80%; 0 B spilled in 0 passes, rate -, 0 failures; 0 admission waits, 0 pressure evictions$'
expect 0 stats --json;           [ "$(json 'd["tenants"]')" = 2 ] || fail "stats --json"
[ "$(json 'd["high_watermark_pct"], d["low_watermark_pct"], d["reclaim_busy_us"]')" = "90 80 0" ] || fail "stats --json: reclaim"
# the spill tier: 4 x pool_bytes by default, in the spill directory
[ "$(json 'int(d["spill_capacity_bytes"]) // 2**20')" -le 2048 ] && [ "$(json 'int(d["spill_capacity_bytes"]) // 2**20')" -ge 2040 ] \
	|| fail "stats --json: spill capacity $(json 'd["spill_capacity_bytes"]')"
expect 0 tenants;                has '^TENANT  *PRIO'; has '^locked .*64.0 MiB'
has '^TENANT .* USE%  *SPILLED  *SESSIONS  *SPILLS  *RESTORES  *WAITS  *WAITED  *MAXWAIT  *REFUSED  *EVICTED  *ALLOWED$'
has '^locked .*  0 B  *0 B  *0  *0  *0  *0  *0  *uid 4242$'
expect 0 tenants --json;         [ "$(json 'd["tenants"][1]["allow_uids"][0]')" = 4242 ] || fail "tenants --json"
[ "$(json '[[t[k] for k in ("spilled_total_bytes", "restored_total_bytes", "waits", "wait_us", "wait_max_us",
	"refusals", "evictions")] for t in d["tenants"]]')" = "[[0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0]]" ] \
	|| fail "tenants --json: pressure counters"
expect 0 sessions;               has 'no sessions'
expect 0 open --layers 32 --kv-heads 8 --q-heads 32 --head-dim 128 --max-tokens 1024 --name chat --json
ID=$(json 'd["id"]')
[ "$(json 'd["k_codec"]+"/"+d["v_codec"]')" = q8/tq4 ] || fail "default codecs"
[ "$(json 'd["owner_uid"]')" = "$(id -u)" ] || fail "owner uid"
expect 0 open --tenant default --layers 2 --kv-heads 2 --q-heads 2 --head-dim 64 --max-tokens 8 --k-codec tq4 --v-codec tq3 --seed 0x1234
has 'rotation seed:   0x0000000000001234'
expect 0 sessions;               has '^ID  *NAME'; has "chat .*32x8/32x128  *q8/tq4"
expect 0 sessions --json;        [ "$(json 'len(d["sessions"])')" = 2 ] || fail "sessions --json"
expect 0 sessions --tenant locked --json; [ "$(json 'len(d["sessions"])')" = 0 ] || fail "sessions --tenant"
expect 0 session "$ID";          has '^name: *chat'; has '^state: *open'; has '^codecs (K/V): *q8 / tq4'
! grep -q '^evict reason' <<<"$OUT" || fail "an open session has an evict reason: $OUT"
expect 0 session "$ID" --json;   [ "$(json 'd["state"]')" = SESSION_STATE_OPEN ] || fail "session --json"
expect 0 evict "$ID";            has "session $ID evicted"
expect 0 session "$ID" --json;   [ "$(json 'd["state"]')" = SESSION_STATE_EVICTED ] || fail "evicted state"
[ "$(json 'd["evict_reason"]')" = "evicted by an operator" ] || fail "session --json: evict_reason"
expect 0 session "$ID";          has '^state: *evicted$'; has '^evict reason: *evicted by an operator$'
expect 1 evict "$ID";            has 'FAILED_PRECONDITION: session .* is evicted already'
expect 0 close "$ID";            has "session $ID closed"
expect 1 close "$ID";            has "NOT_FOUND: no session $ID"
expect 1 session 999;            has 'NOT_FOUND'
expect 0 budget set locked --limit 32M --guaranteed 16M; has '^locked .*16.0 MiB  *32.0 MiB'
expect 0 budget set locked --guaranteed 8MiB --json; [ "$(json 'd["guaranteed_bytes"]')" = $((8 << 20)) ] || fail "budget --json"
expect 1 budget set locked --limit 1T;  has 'INVALID_ARGUMENT'
expect 1 budget set nobody --limit 1M;  has "unknown tenant 'nobody'"
expect 0 config;                 has '^KEY  *VALUE  *DEFAULT  *RELOAD'; has '^pool.pool_bytes  *512MiB  *1GiB  *no'
expect 0 config --json;          [ "$(json '[e["value"] for e in d["entries"] if e["key"]=="tenant.locked.allow_uids"][0]')" = 4242 ] || fail "config --json"

# refusals by the daemon
expect 1 open --tenant locked --layers 1 --kv-heads 1 --q-heads 1 --head-dim 64 --max-tokens 1; has 'PERMISSION_DENIED'
expect 1 open --tenant nope --layers 1 --kv-heads 1 --q-heads 1 --head-dim 64 --max-tokens 1; has "unknown tenant 'nope'"
expect 1 open --layers 1 --kv-heads 1 --q-heads 1 --head-dim 12 --max-tokens 1; has 'head_dim 12 is not supported'
expect 1 open --layers 1 --kv-heads 3 --q-heads 4 --head-dim 64 --max-tokens 1; has 'multiple of n_kv_heads'
expect 1 open --layers 1 --kv-heads 1 --q-heads 1 --head-dim 64 --max-tokens 1 --v-codec zip; has "unknown V codec 'zip'"
expect 1 open --layers 1 --kv-heads 32 --q-heads 32 --head-dim 512 --max-tokens 1 --k-codec f32 --v-codec f32; has "does not fit a pool page"
expect 1 open --layers 1024 --kv-heads 64 --q-heads 64 --head-dim 512 --max-tokens 4294967296; has 'RESOURCE_EXHAUSTED'

# bad usage: exit 2, nothing sent
expect 2 bogus;                  has "unknown command 'bogus'"
expect 2 session;                has 'a session ID is required'
expect 2 session abc;            has "'abc' is not a session id"
expect 2 session 0;              has "is not a session id"
expect 2 evict 1 2;              has 'too many arguments'
expect 2 budget set locked;      has 'give --limit SIZE and/or --guaranteed SIZE'
expect 2 budget set locked --limit 12X; has "'12X' is not a size"
expect 2 tenants --limit 3M;     has 'this command takes no --limit'
expect 2 open --layers 1;        has 'is required'
expect 2 --timeout 0 health;     has 'positive number'
for c in health stats sessions session evict close tenants budget config open; do
	expect 0 "$c" --help;     has "^Usage: tqctl $c"
done
expect 0 --help;                 has '^Commands:'

# a daemon that is not there: exit 1 with a hint
OUT=$("$TQCTL" --socket "$T/none.sock" health 2>&1); rc=$?
[ "$rc" = 1 ] || fail "unreachable daemon: exit $rc"
grep -q 'cannot reach tqkvd' <<<"$OUT" || fail "unreachable daemon: $OUT"
# TQKVD_SOCKET is the default socket
TQKVD_SOCKET=$T/run/control.sock "$TQCTL" health >/dev/null || fail "TQKVD_SOCKET not used"

stop_daemon
[ "$STOP_RC" = 0 ] || fail "exit $STOP_RC"
echo ok
