#!/usr/bin/env bash
# A client opening sessions and data connections up to every cap of a real
# tqkvd (issue 14, item 3): each refusal carries its reason (status name and
# the config option), the daemon stays responsive, another client keeps
# working, and when the hostile client disconnects its sessions and slots
# come back.  (test_hostile checks the same caps in-process with a latency
# bound; multiuser.sh, as root, the caps of one uid against another.)
. "$(dirname "$0")/lib/daemon.bash"
HB=${TQ_BUILD:-$PWD/build}/tests/test_hostile
[ -x "$HB" ] || fail "no $HB (make first)"
cat >"$T/tqkvd.conf" <<CONF
[daemon]
max_sessions_per_uid = 6
max_clients_per_uid = 3
[pool]
pool_bytes = 64M
[tenant default]
limit = 48M
allow_uids = *
CONF
start_daemon --config "$T/tqkvd.conf"
wait_up
client() { "$HB" --client "$1" "$T/run" "${@:2}"; }

# a well-behaved client's session first (it counts against the same uid)
out=$(client fill good) || fail "fill: $out"
ID=${out%% *}
D0=$(client digest "$ID") || fail "digest: $D0"

# sessions: up to max_sessions_per_uid (6, the good one included)
exec 3> >(client sessions 100 >"$T/sessions.out" 2>&1)
for _ in $(seq 100); do grep -q refused "$T/sessions.out" && break; sleep 0.1; done
grep -q "opened 5" "$T/sessions.out" || fail "sessions: $(cat "$T/sessions.out")"
grep -q "max_sessions_per_uid" "$T/sessions.out" || fail "the refusal has no reason: $(cat "$T/sessions.out")"
echo "sessions: $(tr '\n' ' ' <"$T/sessions.out")"
out=$(ctl open --tenant default --layers 1 --kv-heads 1 --q-heads 1 --head-dim 64 --max-tokens 16 2>&1) \
	&& fail "a 7th session was opened: $out"
grep -q "max_sessions_per_uid" <<<"$out" || fail "tqctl open's refusal: $out"
echo "tqctl open: $out"
# the daemon answers and the good session works meanwhile (attach is not a new session)
ctl health >/dev/null || fail "the daemon does not answer at the cap"
D1=$(client digest "$ID") || fail "the good client at the cap: $D1"
[ "$D0" = "$D1" ] || fail "the good session changed: $D0 / $D1"
# connections: max_clients_per_uid (3): the sessions client holds one.  The
# digest client above has exited, but the daemon notices its hang-up on its
# own time: until it has, that connection still counts against the cap
wait_stat data_clients 1 50 "the digest client's connection is still counted"
exec 4> >(client sessions 0 >"$T/c2.out" 2>&1)
exec 5> >(client sessions 0 >"$T/c3.out" 2>&1)
for _ in $(seq 100); do grep -q opened "$T/c2.out" && grep -q opened "$T/c3.out" && break; sleep 0.1; done
grep -q opened "$T/c2.out" && grep -q opened "$T/c3.out" ||
	fail "the 2nd and 3rd connections: $(cat "$T/c2.out" "$T/c3.out")"
out=$(client digest "$ID" 2>&1) && fail "a 4th data connection got in: $out"
grep -q "has 3 data connections already (daemon.max_clients_per_uid)" <<<"$out" || fail "4th connection: $out"
echo "4th connection: $out"
ctl health >/dev/null || fail "the daemon does not answer at the connection cap"
# the hostile client leaves: its sessions and connection slots come back
exec 3>&- 4>&- 5>&-
wait_stat data_clients 0
for _ in $(seq 50); do [ "$(ctl sessions --json | grep -c '"id"')" = 1 ] && break; sleep 0.1; done
[ "$(ctl sessions --json | grep -c '"id"')" = 1 ] || fail "sessions left: $(ctl sessions)"
D2=$(client digest "$ID") || fail "digest after: $D2"
[ "$D0" = "$D2" ] || fail "the good session changed: $D0 / $D2"
out=$(client sessions 3 </dev/null) || fail "after: $out"
grep -q "opened 3" <<<"$out" || fail "sessions do not come back: $out"

# out of descriptors (a flood of connections at a low RLIMIT_NOFILE): the
# data server backs off instead of spinning on its listening socket, which
# stays readable (its CPU time over 2 s of it stays low: a spin takes all
# of a core), says so once, and takes clients again once there are fds
ticks() { awk '{print $14 + $15}' "/proc/$DAEMON_PID/stat"; }
nfd=$(ls "/proc/$DAEMON_PID/fd" | wc -l)
prlimit --pid "$DAEMON_PID" --nofile=$((nfd + 2)):$((nfd + 64)) || fail "prlimit"
python3 - "$T/run/data.sock" <<'PY' &
import socket, sys, time
held = []
for _ in range(8):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(sys.argv[1])
    held.append(s)
time.sleep(3)
PY
FLOOD=$!
sleep 0.5
c0=$(ticks); sleep 2; c1=$(ticks)
wait $FLOOD
prlimit --pid "$DAEMON_PID" --nofile=$((nfd + 64)):$((nfd + 64)) || fail "prlimit back"
hz=$(getconf CLK_TCK)
[ $((c1 - c0)) -lt $((hz / 2)) ] || fail "tqkvd used $((c1 - c0)) ticks (of $hz a second) in 2 s out of descriptors"
grep -q "data socket: accept: Too many open files" "$LOG" || fail "no log line for the accept that found no descriptor"
[ "$(grep -c "data socket: accept: Too many open files" "$LOG")" = 1 ] || fail "the accept failure was logged more than once"
echo "out of descriptors: $((c1 - c0)) ticks in 2 s"
for _ in $(seq 50); do D3=$(client digest "$ID" 2>&1) && break; sleep 0.2; done
[ "$D0" = "$D3" ] || fail "after the descriptors came back: $D3"
echo ok
