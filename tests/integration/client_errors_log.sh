#!/usr/bin/env bash
# The ring logs at most 5 errors per client per 10 s and counts the rest;
# a client that disconnects inside the window must not take that count
# with it: its last line says how many were not logged (the chaos soak
# found TENANT_LIMIT errors no log line accounted for).
. "$(dirname "$0")/lib/daemon.bash"
TQSOAK=${TQ_BUILD:-$PWD/build}/tests/tqsoak
[ -x "$TQSOAK" ] || { echo "tqsoak not built"; exit 77; }

start_daemon
wait_up
"$TQSOAK" errors "$T/run" 8 >"$T/client.out" 2>&1 || { cat "$T/client.out" >&2; fail "tqsoak errors"; }
grep -q "8 of 8 operations failed" "$T/client.out" || fail "$(cat "$T/client.out")"
wait_for "disconnected" "$LOG"
n=$(grep -c "ATTEND session .*query position" "$LOG")
[ "$n" = 5 ] || fail "$n error lines logged, expected 5 (the burst)"
grep -q "pid [0-9]* uid [0-9]*): 3 more errors not logged" "$LOG" ||
	fail "the 3 errors past the burst are not counted in the log at disconnect"
echo "ok: 5 errors logged, 3 counted at disconnect"
