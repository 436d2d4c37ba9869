# Shared helpers for the tqkvd integration tests (sourced, not run: not *.sh).
#
# Each test gets a private temporary directory ($T) with its own run and
# spill directories and, when asked, its own NOTIFY_SOCKET listener; the
# daemon and the listener are killed by the EXIT trap whatever happens.
set -u
TQ_BIN=${TQ_BIN:-$PWD/build/bin}
TQ_SRC=${TQ_SRC:-$PWD}
TQKVD=${TQKVD:-$TQ_BIN/tqkvd} # tqkvd-simt for the emulated GPU pool (cuda_simt.sh)
TQCTL=$TQ_BIN/tqctl
T=$(mktemp -d /tmp/tqkvd-test.XXXXXX)
DAEMON_PID=
NOTIFY_PID=
NOTIFY_LOG=$T/notify.log
LOG=$T/tqkvd.log

cleanup() {
	# the test's own pipes first (exec 3> >(client ...), a fifo's writer): a
	# child reading one to its end, as a client holding sessions until its
	# stdin closes does, would keep the `wait` below waiting for ever when a
	# test fails before closing them
	exec 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&-
	[ -n "$DAEMON_PID" ] && kill -KILL "$DAEMON_PID" 2>/dev/null
	[ -n "$NOTIFY_PID" ] && kill -KILL "$NOTIFY_PID" 2>/dev/null
	wait 2>/dev/null
	rm -rf "$T"
}
trap cleanup EXIT

fail() {
	echo "FAIL: $*" >&2
	[ -f "$LOG" ] && { echo "--- daemon log:" >&2; tail -n 30 "$LOG" >&2; }
	exit 1
}

ctl() { "$TQCTL" --socket "$T/run/control.sock" "$@"; }

# A NOTIFY_SOCKET of our own: every datagram is appended to $NOTIFY_LOG,
# one message per record, records separated by a line "--".
notify_listen() {
	python3 - "$T/notify.sock" "$NOTIFY_LOG" <<'PY' &
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
open(sys.argv[2], "a").close()
while True:
    d = s.recv(65536).decode(errors="replace")
    with open(sys.argv[2], "a") as f:
        f.write(d.strip("\n") + "\n--\n")
PY
	NOTIFY_PID=$!
	for _ in $(seq 100); do [ -S "$T/notify.sock" ] && return 0; sleep 0.05; done
	fail "notify listener did not start"
}

# start_daemon [ARGS...]: tqkvd on $T/run and $T/spill, log in $LOG.
start_daemon() {
	"$TQKVD" --run-dir "$T/run" --spill-dir "$T/spill" "$@" >>"$LOG" 2>&1 &
	DAEMON_PID=$!
}

# wait_for PATTERN FILE [TENTHS]: until a line of FILE matches.
wait_for() {
	local n=${3:-100}
	for _ in $(seq "$n"); do
		grep -q -- "$1" "$2" 2>/dev/null && return 0
		kill -0 "$DAEMON_PID" 2>/dev/null || fail "tqkvd died while waiting for '$1'"
		sleep 0.1
	done
	fail "timed out waiting for '$1' in $2"
}

# wait_up: until the control socket answers (no NOTIFY_SOCKET needed).
wait_up() {
	for _ in $(seq 100); do
		ctl health >/dev/null 2>&1 && return 0
		kill -0 "$DAEMON_PID" 2>/dev/null || fail "tqkvd exited during start-up"
		sleep 0.1
	done
	fail "tqkvd did not come up"
}

# stop_daemon [SIGNAL]: signal, wait; sets STOP_RC and STOP_MS.
stop_daemon() {
	local t0 t1
	t0=$(date +%s%N)
	kill -"${1:-TERM}" "$DAEMON_PID"
	wait "$DAEMON_PID"
	STOP_RC=$?
	t1=$(date +%s%N)
	STOP_MS=$(( (t1 - t0) / 1000000 ))
	DAEMON_PID=
}

# gstat FIELD: one field of GetStats (tqctl stats --json); 0 when absent.
gstat() { ctl stats --json | python3 -c "import json,sys; d=json.load(sys.stdin); print(d.get('$1', 0))"; }
# sess ID FIELD: one field of GetSession.
sess() { ctl session "$1" --json | python3 -c "import json,sys; d=json.load(sys.stdin); print(d.get('$2', 0))"; }
# wait_stat FIELD VALUE [TENTHS] [WHY]: until GetStats shows it (default 5 s).
wait_stat() {
	for _ in $(seq "${3:-50}"); do [ "$(gstat "$1")" = "$2" ] && return 0; sleep 0.1; done
	fail "GetStats $1 is $(gstat "$1"), expected $2${4:+ ($4)}"
}
