#!/usr/bin/env bash
# No definite leaks in tqkvd over a full control-plane scenario, under
# valgrind (gRPC's own "still reachable" blocks do not count).  Skipped
# without valgrind and for sanitizer builds (ASan checks leaks itself there).
. "$(dirname "$0")/lib/daemon.bash"
command -v valgrind >/dev/null || { echo "valgrind missing"; exit 77; }
ldd "$TQKVD" | grep -q 'libasan\|libtsan\|libubsan' && { echo "sanitizer build: valgrind does not apply"; exit 77; }

printf '[tenant default]\nallow_uids = *\n[tenant b]\nlimit = 64M\nallow_uids = *\n' >"$T/tqkvd.conf"
valgrind -q --leak-check=full --errors-for-leak-kinds=definite --error-exitcode=99 \
	--log-file="$T/vg.log" "$TQKVD" --config "$T/tqkvd.conf" --run-dir "$T/run" --spill-dir "$T/spill" \
	>>"$LOG" 2>&1 &
DAEMON_PID=$!
for _ in $(seq 300); do ctl health >/dev/null 2>&1 && break; sleep 0.1; done
ctl health >/dev/null || fail "tqkvd under valgrind did not come up"
ctl open --layers 4 --kv-heads 2 --q-heads 4 --head-dim 64 --max-tokens 16 --name a >/dev/null || fail open
ctl open --tenant b --layers 4 --kv-heads 2 --q-heads 4 --head-dim 128 --max-tokens 16 >/dev/null || fail open
ctl open --tenant b --layers 4 --kv-heads 2 --q-heads 4 --head-dim 12 --max-tokens 16 >/dev/null 2>&1 && fail "bad open accepted"
ctl sessions --json >/dev/null && ctl session 1 >/dev/null && ctl evict 1 >/dev/null && ctl close 2 >/dev/null \
	&& ctl tenants >/dev/null && ctl budget set b --limit 32M >/dev/null && ctl stats >/dev/null \
	&& ctl config >/dev/null || fail "a tqctl command failed"
kill -HUP "$DAEMON_PID"
sleep 1
ctl health >/dev/null || fail "not answering after reload"
# session 1 (evicted) is still open at exit: the shutdown path frees it
kill -TERM "$DAEMON_PID"
wait "$DAEMON_PID"; rc=$?
DAEMON_PID=
[ "$rc" = 0 ] || { cat "$T/vg.log" >&2; fail "tqkvd under valgrind: exit $rc (99: definite leaks or errors)"; }
echo ok
