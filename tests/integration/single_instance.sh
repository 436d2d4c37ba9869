#!/usr/bin/env bash
# One tqkvd per run directory, and per spill directory: a second one exits
# non-zero with a clear message and leaves the first one (and its socket,
# its spill file and persistent sessions) alone.
. "$(dirname "$0")/lib/daemon.bash"

start_daemon
wait_up
FIRST=$DAEMON_PID
ino_before=$(stat -c %i "$T/run/control.sock")
[ "$(stat -c %a "$T/run/control.sock")" = 660 ] || fail "control.sock mode is $(stat -c %a "$T/run/control.sock")"

out=$(timeout 10 "$TQKVD" --run-dir "$T/run" --spill-dir "$T/spill2" 2>&1); rc=$?
[ "$rc" = 1 ] || fail "second instance: exit $rc, expected 1 ($out)"
grep -q "another tqkvd (pid $FIRST) is running on $T/run" <<<"$out" || fail "unclear message: $out"
[ "$(stat -c %i "$T/run/control.sock")" = "$ino_before" ] || fail "the second instance replaced control.sock"
kill -0 "$FIRST" || fail "the first instance died"
ctl health >/dev/null || fail "the first instance stopped answering"
# ... and one per spill directory: another run_dir on the same spill_dir
# would share spill.dat's slots, session-ids and sessions/
out=$(timeout 10 "$TQKVD" --run-dir "$T/run2" --spill-dir "$T/spill" 2>&1); rc=$?
[ "$rc" = 1 ] || fail "a second instance on the same spill directory: exit $rc, expected 1 ($out)"
grep -q "another tqkvd (pid $FIRST) is using the spill directory $T/spill" <<<"$out" || fail "unclear message: $out"
kill -0 "$FIRST" || fail "the first instance died"
ctl health >/dev/null || fail "the first instance stopped answering"

# after a clean stop the directory is free again, a stale socket is no obstacle
stop_daemon
# one directory for both (and a link to it): one lock, taken once
mkdir -p "$T/both"; ln -s "$T/both" "$T/both-link"
for sd in "$T/both" "$T/both-link"; do
	"$TQKVD" --run-dir "$T/both" --spill-dir "$sd" >"$T/both.log" 2>&1 &
	BOTH=$!
	for _ in $(seq 100); do [ -S "$T/both/control.sock" ] && break; sleep 0.05; done
	kill -0 "$BOTH" 2>/dev/null || fail "run_dir = spill_dir ($sd): $(cat "$T/both.log")"
	kill -TERM "$BOTH"; wait "$BOTH"; rc=$?
	[ "$rc" = 0 ] || fail "run_dir = spill_dir ($sd): exit $rc: $(cat "$T/both.log")"
	rm -f "$T/both/control.sock" "$T/both/data.sock"
done
[ "$STOP_RC" = 0 ] || fail "exit $STOP_RC"
# a lock file another user's run left (root's `make run`, then the tqkvd
# user): the message says whose it is and what to do
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null && id nobody >/dev/null 2>&1; then
	own=$(mktemp -d /tmp/tq-own.XXXXXX)
	chmod 0755 "$own"
	mkdir -m 0777 "$own/run" "$own/spill"
	cp "$TQKVD" "$own/tqkvd"
	: >"$own/run/tqkvd.lock"
	out=$(timeout 10 setpriv --reuid=nobody --regid=nogroup --clear-groups "$own/tqkvd" --run-dir "$own/run" \
		--spill-dir "$own/spill" 2>&1); rc=$?
	rm -rf "$own"
	[ "$rc" = 1 ] || fail "a lock file root left, tqkvd as nobody: exit $rc ($out)"
	grep -q "it belongs to uid 0 and tqkvd runs as uid $(id -u nobody); give .* (chown -R)" <<<"$out" ||
		fail "a lock file another user left: unclear message: $out"
fi
python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1])' "$T/run/control.sock"
start_daemon
wait_up
stop_daemon
[ "$STOP_RC" = 0 ] || fail "restart: exit $STOP_RC"
echo ok
