#!/usr/bin/env bash
# Every tqctl command against a real tqkvd: tables, --json, exit codes
# (0 ok, 1 error, 2 usage), --help per command, and bad requests; top's
# plain snapshots, its terminal mode (under script(1)) and a daemon that
# goes away under it.
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
sparse_v = 0.001
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
json_of() { # json_of CMD ARG EXPR: EXPR over `tqctl CMD ARG --json`, printed space-separated
	ctl "$1" "$2" --json | python3 -c "import json,sys; d=json.load(sys.stdin); v=$3; print(*(v if isinstance(v, tuple) else (v,)))" \
		|| fail "tqctl $1 $2 --json"
}

expect 0 health;                 has '^SERVING: tqkvd'
expect 0 health --json;          [ "$(json 'd["status"]')" = SERVING ] || fail "health --json"
expect 0 stats;                  has 'pool: .*512 MiB'
has "^spill: .* used of 2.00 GiB ($T/spill/spill.dat; io_uring"
has '^reclaim: *watermarks 90%/80%; 0 B spilled in 0 passes, rate -, 0 failures; 0 admission waits, 0 pressure evictions$'
expect 0 stats --json;           [ "$(json 'd["tenants"]')" = 2 ] || fail "stats --json"
[ "$(json 'd["high_watermark_pct"], d["low_watermark_pct"], d["reclaim_busy_us"]')" = "90 80 0" ] || fail "stats --json: reclaim"
[ "$(json 'd["spill_io_errors"], d["spill_retries"]')" = "0 0" ] || fail "stats --json: spill errors and retries"
# the spill tier: 4 x pool_bytes by default, in the spill directory
[ "$(json 'int(d["spill_capacity_bytes"]) // 2**20')" -le 2048 ] && [ "$(json 'int(d["spill_capacity_bytes"]) // 2**20')" -ge 2040 ] \
	|| fail "stats --json: spill capacity $(json 'd["spill_capacity_bytes"]')"
expect 0 tenants;                has '^TENANT  *PRIO'; has '^locked .*64.0 MiB'
has '^TENANT .* USE%  *SPILLED  *SESSIONS  *SPILLS  *RESTORES  *WAITS  *WAITED  *MAXWAIT  *REFUSED  *AT-LIMIT  *EVICTED  *SPARSE-V  *V-SKIP  *ALLOWED$'
has '^locked .*  0 B  *0 B  *0  *0  *0  *0  *0  *0  *0.001  *-  *uid 4242$'
has '^default .*  0  *-  *\*$'
expect 0 tenants --json;         [ "$(json 'd["tenants"][1]["allow_uids"][0]')" = 4242 ] || fail "tenants --json"
[ "$(json '[[t[k] for k in ("spilled_total_bytes", "restored_total_bytes", "waits", "wait_us", "wait_max_us",
	"refusals", "evictions", "limit_refusals")] for t in d["tenants"]]')" = "[[0, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0]]" ] \
	|| fail "tenants --json: pressure counters"
[ "$(json '[(round(t["sparse_v"], 6), t["value_chunks"], t["value_chunks_skipped"]) for t in d["tenants"]]')" = "[(0, 0, 0), (0.001, 0, 0)]" ] \
	|| fail "tenants --json: sparse-V"
expect 0 sessions;               has 'no sessions'
expect 0 open --layers 32 --kv-heads 8 --q-heads 32 --head-dim 128 --max-tokens 1024 --name chat --json
ID=$(json 'd["id"]')
[ "$(json 'd["k_codec"]+"/"+d["v_codec"]')" = q8/tq4 ] || fail "default codecs"
[ "$(json 'd["owner_uid"]')" = "$(id -u)" ] || fail "owner uid"
expect 0 open --tenant default --layers 2 --kv-heads 2 --q-heads 2 --head-dim 64 --max-tokens 8 --k-codec tq4 --v-codec tq3 --seed 0x1234
has 'rotation seed:   0x0000000000001234'
ID2=$(awk '/^id:/ {print $2}' <<<"$OUT")
expect 0 sessions;               has '^ID  *NAME'; has "chat .*32x8/32x128  *q8/tq4"
expect 0 sessions --json;        [ "$(json 'len(d["sessions"])')" = 2 ] || fail "sessions --json"
expect 0 sessions --tenant locked --json; [ "$(json 'len(d["sessions"])')" = 0 ] || fail "sessions --tenant"
expect 0 session "$ID";          has '^name: *chat'; has '^state: *open'; has '^codecs (K/V): *q8 / tq4'
# the K/V transforms: daemon.kv_transform (default) unless the open names one
has '^kv transform: *k-center+v-eq+k-eq-qk+k-unshrink+k-order$'; has '^layer transforms: - (no data yet'
[ "$(json_of session "$ID" 'd["kv_transform"], len(d.get("layer_transforms", []))')" = "k-center+v-eq+k-eq-qk+k-unshrink+k-order 0" ] \
	|| fail "session --json: kv_transform"
expect 0 open --layers 1 --kv-heads 1 --q-heads 1 --head-dim 64 --max-tokens 8 --kv-transform none
has '^kv transform: *none$'; ID3=$(awk '/^id:/ {print $2}' <<<"$OUT")
expect 0 open --layers 1 --kv-heads 1 --q-heads 1 --head-dim 64 --max-tokens 8 --kv-transform k-center,v-center
has '^kv transform: *k-center+v-center$'; ID4=$(awk '/^id:/ {print $2}' <<<"$OUT")
expect 0 close "$ID3"; expect 0 close "$ID4"
expect 1 open --layers 1 --kv-heads 1 --q-heads 1 --head-dim 64 --max-tokens 8 --kv-transform k-eq-k+k-eq-qk
has "INVALID_ARGUMENT: unknown kv_transform 'k-eq-k+k-eq-qk' (known: none, default, .*k-center"
expect 0 open --help;            has -- '--kv-transform MODE'
expect 0 config;                 has '^daemon.kv_transform  *k-center+v-eq+k-eq-qk+k-unshrink+k-order  *default  *yes$'
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
# the budget that runs (budget set), not the file's, until a reload
has '^tenant.locked.limit  *32MiB '; has '^tenant.locked.guaranteed  *8MiB '
expect 0 config --json;          [ "$(json '[e["value"] for e in d["entries"] if e["key"]=="tenant.locked.allow_uids"][0]')" = 4242 ] || fail "config --json"

# top without a terminal: -n plain snapshots, no escape codes; rates and
# TOK/S need two refreshes ('-' on the first).  Session $ID2 is open, $ID
# is closed.
expect 0 top -n 2 --interval 0.2
! grep -q $'\033' <<<"$OUT" || fail "top: escape codes without a terminal: $OUT"
[ "$(grep -c '^tqkvd .*, up ' <<<"$OUT")" = 2 ] || fail "top -n 2: not two snapshots: $OUT"
has '^pool: *0 B used of 512 MiB (0%; watermarks 90%/80%), [0-9]* pages free$'
has '^spill: *0 B used of 2.00 GiB; read -, write -$'
has '^spill: *0 B used of 2.00 GiB; read 0.0 MB/s, write 0.0 MB/s$'
has '^reclaim: *-, busy -; since start 0 B in 0 passes, 0 failed$'
has '^data: *0 clients, 0 ops/s; sessions 1 open, 0 evicted$'
[ "$(grep -c '^TENANT  *PRIO .*MAXWAIT  *REFUSED  *AT-LIMIT  *EVICTED$' <<<"$OUT")" = 2 ] || fail "top: no tenants tables: $OUT"
has '^locked  *0  *8.00 MiB  *32.0 MiB  *0 B  *0%'
[ "$(grep -c '^sessions: 1 of 1, busiest first' <<<"$OUT")" = 2 ] || fail "top: no sessions sections: $OUT"
SNAP1=$(awk '/^tqkvd /{n++} n==1' <<<"$OUT"); SNAP2=$(awk '/^tqkvd /{n++} n==2' <<<"$OUT")
awk '/^tqkvd / && NR > 1 && prev != "" {bad = 1} {prev = $0} END {exit bad}' <<<"$OUT" \
	|| fail "top: snapshots are not separated by a blank line: $OUT"
sed -n '/^sessions:/,$p' <<<"$SNAP1" | grep -q "^ *$ID2  *default  *open  *0  *-  *0 B  *0 B  *[0-9]*s$" \
	|| fail "top: session $ID2 not in the first snapshot: $SNAP1"
sed -n '/^sessions:/,$p' <<<"$SNAP2" | grep -q "^ *$ID2  *default  *open  *0  *0.0  *0 B  *0 B  *[0-9]*s$" \
	|| fail "top: session $ID2 not in the second snapshot with its tokens/s: $SNAP2"
sed -n '/^sessions:/,$p' <<<"$OUT" | grep -q "^ *$ID  " && fail "top: closed session $ID listed: $OUT"
expect 0 top;                    [ "$(grep -c '^tqkvd ' <<<"$OUT")" = 1 ] || fail "top: not one snapshot by default: $OUT"
expect 2 top --interval 0;       has "tqctl: --interval: '0' is not a number of seconds above 0"
expect 2 top --interval abc;     has "'abc' is not a number of seconds"
expect 2 top --interval -1;      has "'-1' is not a number of seconds"
expect 2 top -n 0;               has "'0' is not a positive number"
expect 2 top 5;                  has 'top takes options only'
expect 2 top --json;             has 'top takes no --json; use stats, tenants or sessions --json'
expect 2 tenants -n 2;           has 'this command takes no -n/--count'
expect 2 sessions --interval 1;  has 'this command takes no --interval'

# top on a terminal (script(1) gives it one): redraws in place, q quits at
# once, and the cursor is shown again
if command -v script >/dev/null; then
	mkfifo "$T/keys"
	script -qefc "$TQCTL --socket $T/run/control.sock top --interval 0.2" /dev/null <"$T/keys" >"$T/top.out" 2>&1 &
	SPID=$!
	exec 3>"$T/keys"
	for _ in $(seq 50); do [ "$(grep -c 'q quits' "$T/top.out")" -ge 2 ] && break; sleep 0.1; done
	[ "$(grep -c 'q quits' "$T/top.out")" -ge 2 ] || fail "top on a terminal: no two frames: $(cat -v "$T/top.out")"
	printf q >&3
	for _ in $(seq 20); do kill -0 $SPID 2>/dev/null || break; sleep 0.1; done
	kill -0 $SPID 2>/dev/null && { kill $SPID; fail "top on a terminal did not quit on q within 2 s"; }
	wait $SPID; rc=$?
	exec 3>&-
	[ "$rc" = 0 ] || fail "top on a terminal: exit $rc: $(cat -v "$T/top.out")"
	grep -q $'\033\[H\033\[2Jtqkvd ' "$T/top.out" || fail "top on a terminal: no clear and redraw"
	grep -q "^ *$ID2  *default  *open " "$T/top.out" || fail "top on a terminal: session $ID2 missing"
	[ "$(tail -c 6 "$T/top.out")" = $'\033[?25h' ] || fail "top on a terminal: the cursor is not shown again"
else
	echo "script(1) not installed: top's terminal mode not tested"
fi

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
for c in health stats sessions session evict close tenants budget config open top; do
	expect 0 "$c" --help;     has "^Usage: tqctl $c"
done
expect 0 --help;                 has '^Commands:'

# a daemon that is not there: exit 1 with a hint
OUT=$("$TQCTL" --socket "$T/none.sock" health 2>&1); rc=$?
[ "$rc" = 1 ] || fail "unreachable daemon: exit $rc"
grep -q 'cannot reach tqkvd' <<<"$OUT" || fail "unreachable daemon: $OUT"
# TQKVD_SOCKET is the default socket
TQKVD_SOCKET=$T/run/control.sock "$TQCTL" health >/dev/null || fail "TQKVD_SOCKET not used"

# a daemon that goes away under top: the error, exit 1
ctl top --interval 0.2 -n 1000 >"$T/top2.out" 2>&1 &
TOP=$!
for _ in $(seq 50); do grep -q '^sessions:' "$T/top2.out" && break; sleep 0.1; done
stop_daemon
[ "$STOP_RC" = 0 ] || fail "exit $STOP_RC"
for _ in $(seq 50); do kill -0 $TOP 2>/dev/null || break; sleep 0.1; done
kill -0 $TOP 2>/dev/null && { kill $TOP; fail "top still runs without a daemon"; }
wait $TOP; rc=$?
[ "$rc" = 1 ] || fail "top without a daemon: exit $rc: $(tail -n 3 "$T/top2.out")"
# (refused at connect, or the call in flight cancelled by the daemon's shutdown)
grep -Eq 'cannot reach tqkvd|tqkvd at .* cancelled the call' "$T/top2.out" \
	|| fail "top without a daemon: $(tail -n 3 "$T/top2.out")"
echo ok
