#!/usr/bin/env bash
# What a client's death, a daemon's restart and a stopped daemon must not
# do (issue 15):
#  1. a client that dies inside tqkv_session_open (after the daemon made
#     the session) or inside tqkv_session_close (after the CLOSE was sent)
#     leaves no session and no pages behind, ephemeral or detached;
#  2. session ids never repeat across restarts (clean or SIGKILL): an id
#     from before answers NO_SESSION, not someone else's new session;
#  3. a data operation against a stopped daemon (SIGSTOP) returns
#     -ETIMEDOUT after the connection's op_timeout_ms — counted from its
#     submit, also when the wait begins later — a new connection's
#     handshake gives up after its timeout_ms, the connection works
#     again after SIGCONT, and a killed daemon is noticed at once.
. "$(dirname "$0")/lib/daemon.bash"
CLIENT=${TQ_BUILD:-$PWD/build}/tests/test_ring
[ -x "$CLIENT" ] || { echo "test_ring not built"; exit 77; }

cat >"$T/tqkvd.conf" <<CONF
[pool]
pool_bytes = 128M
[tenant default]
limit = 64M
allow_uids = *
CONF
start_daemon --config "$T/tqkvd.conf"
wait_up


# 1. deaths inside open and close (TQKV_TEST_DIE_AT: libtqkv's test hook
# exits with 86 at the named point, as a SIGKILL there would)
for run in "open-after-rpc ephemeral" "close-after-submit ephemeral" "close-after-submit detached"; do
	set -- $run
	out=$(TQKV_TEST_DIE_AT=$1 "$CLIENT" --client life "$T/run" "$2" 2>&1); rc=$?
	[ "$rc" = 86 ] || fail "$run: the client exited $rc, not at the hook: $out"
	wait_stat data_clients 0 50 "$run"
	wait_stat sessions_open 0 50 "$run: a session leaked"
	wait_stat used_bytes 0 50 "$run: pages leaked"
done
# and the same calls without a death complete normally
out=$("$CLIENT" --client life "$T/run" detached 2>&1) || fail "a plain life: $out"
wait_stat sessions_open 0 50 "a closed detached session is still open"

# 2. ids across restarts
"$CLIENT" --client hold "$T/run" detached >"$T/hold.out" 2>&1 &
HOLD=$!
for _ in $(seq 100); do grep -q ready "$T/hold.out" && break; sleep 0.1; done
OLD=$(awk '/ready/ {print $1}' "$T/hold.out")
[ -n "$OLD" ] || fail "client did not get ready: $(cat "$T/hold.out")"
kill -KILL $HOLD; wait $HOLD 2>/dev/null
[ -f "$T/spill/session-ids" ] || fail "no session-ids file in the spill directory"
for how in KILL TERM; do
	stop_daemon $how
	start_daemon --config "$T/tqkvd.conf"
	wait_up
	out=$("$CLIENT" --client attach "$T/run" "$OLD" 2>&1); rc=$?
	[ "$rc" = 3 ] && grep -q "no such session" <<<"$out" || fail "after $how: id $OLD from before the restart: $out"
	out=$("$CLIENT" --client life "$T/run" ephemeral 2>&1) || fail "after $how: $out"
	NEW=$(awk '/^id/ {print $2}' <<<"$out")
	[ "$NEW" -gt "$OLD" ] || fail "after $how: new session id $NEW does not follow $OLD"
	OLD=$NEW
done
# a damaged id file stops the daemon from starting rather than reuse ids
stop_daemon TERM
echo "garbage" >"$T/spill/session-ids"
out=$(timeout 10 "$TQKVD" --config "$T/tqkvd.conf" --run-dir "$T/run" --spill-dir "$T/spill" 2>&1); rc=$?
[ "$rc" = 1 ] && grep -q "session-ids" <<<"$out" || fail "a damaged session-ids file: exit $rc: $out"
rm "$T/spill/session-ids"
start_daemon --config "$T/tqkvd.conf"
wait_up

# 3. deadlines: a stopped daemon, then a dead one
mkfifo "$T/cmd"
"$CLIENT" --client stall "$T/run" 700 <"$T/cmd" >"$T/stall.out" 2>&1 &
STALL=$!
trap 'kill -KILL $STALL 2>/dev/null; cleanup' EXIT
exec 3>"$T/cmd"
for _ in $(seq 100); do grep -q ready "$T/stall.out" && break; sleep 0.1; done
grep -q ready "$T/stall.out" || fail "stall client: $(cat "$T/stall.out")"
# line N of the output (after "ready"), within 10 s
answer() {
	for _ in $(seq 100); do
		[ "$(grep -c '^rc=' "$T/stall.out")" -ge "$1" ] && { grep '^rc=' "$T/stall.out" | sed -n "$1p"; return 0; }
		sleep 0.1
	done
	fail "no answer $1 from the client: $(cat "$T/stall.out")"
}
echo go >&3
a=$(answer 1); [[ $a == "rc=1 "* ]] || fail "attend before the stop: $a"
# stop the daemon, every thread stopped (state T) before the client asks
stop_all() {
	kill -STOP "$DAEMON_PID"
	for _ in $(seq 100); do
		grep -qv '^T' <(for f in /proc/"$DAEMON_PID"/task/*/stat; do sed 's/^.*) //' "$f" | cut -c1; done) || break
		sleep 0.01
	done
}
stop_all
echo go >&3
a=$(answer 2)
kill -CONT "$DAEMON_PID"
[[ $a == "rc=-110 "* ]] || fail "a stopped daemon: $a (expected -ETIMEDOUT)"
ms=$(sed 's/.*ms=\([0-9]*\).*/\1/' <<<"$a")
[ "$ms" -ge 650 ] && [ "$ms" -lt 3000 ] || fail "timed out after $ms ms, op_timeout_ms is 700"
grep -q "abandoned" <<<"$a" || fail "the timeout does not say what happened: $a"
echo go >&3
a=$(answer 3); [[ $a == "rc=1 "* ]] || fail "after SIGCONT the connection does not work: $a"
# the deadline runs from the submit: submitted, waited for 500 ms later,
# it times out 700 ms after the submit, not 700 ms after the wait began
stop_all
echo late >&3
a=$(answer 4)
# a new connection's handshake waits the connection's timeout_ms (400),
# not a fixed 10 s
c=$("$CLIENT" --client connect "$T/run" 400)
# ... also while a signal handler runs every 10 ms (a socket call with a
# timeout is not restarted: it failed with -EINTR at the first signal)
cs=$("$CLIENT" --client connect "$T/run" 400 signals)
# ... and so does connect() itself when the listen queue is full
python3 - "$T/run/data.sock" "$CLIENT" "$T/run" >"$T/full.out" 2>&1 <<'PY' || true
import socket, subprocess, sys
held = []
for _ in range(4096):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.setblocking(False)
    try:
        s.connect(sys.argv[1])
    except (BlockingIOError, InterruptedError):
        s.close()
        break
    held.append(s)
print("held", len(held))
try:
    for extra in ([], ["signals"]):
        print(subprocess.run([sys.argv[2], "--client", "connect", sys.argv[3], "400"] + extra,
                             capture_output=True, text=True, timeout=10).stdout, end="")
except subprocess.TimeoutExpired:
    print("connect: no answer in 10 s")
PY
kill -CONT "$DAEMON_PID"
[[ $a == "rc=-110 "* ]] || fail "a late wait on a stopped daemon: $a (expected -ETIMEDOUT)"
ms=$(sed 's/.*ms=\([0-9]*\).*/\1/' <<<"$a")
[ "$ms" -ge 650 ] && [ "$ms" -lt 1100 ] || fail "a wait 500 ms after the submit timed out $ms ms after it (op_timeout_ms is 700)"
grep -q "of the submit" <<<"$a" || fail "the timeout does not say the deadline is the submit's: $a"
[[ $c == "rc=-110 "* ]] || fail "a connection to a stopped daemon: $c (expected -ETIMEDOUT)"
ms=$(sed 's/.*ms=\([0-9]*\).*/\1/' <<<"$c")
[ "$ms" -ge 350 ] && [ "$ms" -lt 3000 ] || fail "a connection's handshake timed out after $ms ms, timeout_ms is 400"
grep -q "timeout_ms" <<<"$c" || fail "the handshake's timeout does not say which: $c"
[[ $cs == "rc=-110 "* ]] && grep -q "timeout_ms" <<<"$cs" \
	|| fail "a connection to a stopped daemon, signals arriving: $cs (expected -ETIMEDOUT)"
ms=$(sed 's/.*ms=\([0-9]*\).*/\1/' <<<"$cs")
[ "$ms" -ge 350 ] && [ "$ms" -lt 3000 ] || fail "a handshake with signals arriving gave up after $ms ms, timeout_ms is 400"
grep -q " sigs=[1-9]" <<<"$cs" || fail "no signal arrived during the handshake: $cs"
n=0
while read -r f; do
	n=$((n + 1))
	[[ $f == "rc=-110 "* ]] && grep -q "no room in its queue" <<<"$f" \
		|| fail "a connection to a stopped daemon with a full listen queue ($n): $(cat "$T/full.out")"
	ms=$(sed 's/.*ms=\([0-9]*\).*/\1/' <<<"$f")
	[ "$ms" -ge 350 ] && [ "$ms" -lt 3000 ] || fail "connect() to a full queue ($n) gave up after $ms ms, timeout_ms is 400"
done < <(grep '^rc=' "$T/full.out")
[ "$n" = 2 ] || fail "connections to a full queue: $n answers of 2: $(cat "$T/full.out")"
grep -q " sigs=[1-9]" "$T/full.out" || fail "no signal arrived during connect(): $(cat "$T/full.out")"
echo go >&3
a=$(answer 5); [[ $a == "rc=1 "* ]] || fail "after the late timeout the connection does not work: $a"
# a daemon that answers: connected whatever signals arrive meanwhile
cs=$("$CLIENT" --client connect "$T/run" 2000 signals)
[[ $cs == "rc=0 "* ]] || fail "a connection with signals arriving: $cs"
kill -KILL "$DAEMON_PID"; wait "$DAEMON_PID" 2>/dev/null; DAEMON_PID=
echo go >&3
a=$(answer 6)
[[ $a == "rc=-"* ]] || fail "a dead daemon: $a"
ms=$(sed 's/.*ms=\([0-9]*\).*/\1/' <<<"$a")
[ "$ms" -lt 500 ] || fail "a dead daemon was noticed after $ms ms"
exec 3>&-
wait $STALL
echo ok
