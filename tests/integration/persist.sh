#!/usr/bin/env bash
# Persistent sessions through a real tqkvd (issue 9, item 5, and its kill
# test).  A client (test_persist --client fill) appends to a persistent
# session and logs, after every completed append, the layer's length and
# the bits of attention at its last position; test_persist --client verify
# re-attaches by name after a restart and checks that every acknowledged
# token is there and attention is bit-identical.
#  1. clean restart (SIGTERM): everything comes back; checkpoints at
#     shutdown; a non-persistent session from before is gone and its spill
#     slots are free;
#  2. SIGKILL at a random moment while appending, KILL_ROUNDS times
#     (default 3; `make test-faults` runs 20): nothing acknowledged is lost;
#  3. tqctl checkpoint; a damaged manifest: that session is dropped with the
#     reason in the log (kept aside as .dropped), the other one comes back;
#  4. a damaged page of a restored session: DATA_LOSS for it, never served.
. "$(dirname "$0")/lib/daemon.bash"
CLIENT=${TQ_BUILD:-$PWD/build}/tests/test_persist
[ -x "$CLIENT" ] || { echo "test_persist not built"; exit 77; }
ROUNDS=${KILL_ROUNDS:-3}

cat >"$T/tqkvd.conf" <<CONF
[pool]
pool_bytes = 128M
page_bytes = 16K
spill_bytes = 256M
checkpoint_interval = 200ms
[tenant default]
allow_uids = *
CONF
start_daemon --config "$T/tqkvd.conf"
wait_up

# fill SECONDS: append to session "p" for that long (or until the daemon dies)
fill() { "$CLIENT" --client fill "$T/run" p "$1" "$T/progress.bin" >>"$T/client.out" 2>&1; }
verify() {
	"$CLIENT" --client verify "$T/run" p "$T/progress.bin" >"$T/verify.out" 2>&1 ||
		{ cat "$T/verify.out" >&2; fail "$1: verification failed"; }
	grep -q "bit-identical" "$T/verify.out" || fail "$1: $(cat "$T/verify.out")"
}

# 1. clean restart
fill 1.5 || fail "fill: $(tail -3 "$T/client.out")"
P=$(ctl sessions --json | python3 -c "import json,sys; print([s['id'] for s in json.load(sys.stdin).get('sessions',[]) if s.get('name')=='p'][0])")
[ "$(sess "$P" persistent)" = True ] || fail "session p is not persistent"
# an ordinary session with spilled pages: it must not come back
"${TQ_BUILD:-$PWD/build}/tests/test_ring" --client hold "$T/run" detached >"$T/hold.out" 2>&1 &
HP=$!
for _ in $(seq 100); do grep -q ready "$T/hold.out" && break; sleep 0.1; done
kill -KILL $HP; wait $HP 2>/dev/null
H=$(awk '/ready/ {print $1}' "$T/hold.out")
[ -n "$H" ] || fail "the ordinary session did not get ready"
ctl spill "$H" >/dev/null || fail "tqctl spill $H"
stop_daemon TERM
[ "$STOP_RC" = 0 ] || fail "SIGTERM: exit $STOP_RC"
# a clean stop checkpoints: the journal holds nothing the manifest lacks
[ "$(stat -c %s "$T/spill/sessions/$P.tqj")" = 64 ] || fail "SIGTERM: the journal was not emptied by a checkpoint"
start_daemon --config "$T/tqkvd.conf"
wait_up
grep -q "persistent sessions: 1 restored" "$LOG" || fail "restart: no 'persistent sessions: 1 restored' in the log"
ctl session "$H" >/dev/null 2>&1 && fail "the ordinary session $H came back"
[ "$(sess "$P" resident_bytes)" = 0 ] || fail "a restored session starts spilled"
verify "clean restart"
# only the persistent session's pages hold spill slots
used=$(gstat spill_used_bytes)
spilled=$(sess "$P" spilled_bytes)
[ "$used" -ge "$spilled" ] || fail "spill use $used < the session's spilled $spilled"
echo "clean restart: $(cat "$T/verify.out")"

# 2. SIGKILL while appending, at a random moment
for round in $(seq "$ROUNDS"); do
	fill 30 &
	FP=$!
	sleep "$(python3 -c "import random; print(round(random.uniform(0.3, 1.5), 3))")"
	kill -KILL "$DAEMON_PID"
	wait "$DAEMON_PID" 2>/dev/null
	DAEMON_PID=
	wait $FP || fail "round $round: the client failed: $(tail -3 "$T/client.out")"
	start_daemon --config "$T/tqkvd.conf"
	wait_up
	verify "kill round $round"
	echo "kill round $round: $(tail -1 "$T/client.out" | sed 's/stopped at //'), $(cat "$T/verify.out")"
done
grep -q "journal" "$LOG" || fail "no journal replay was ever logged"

# 3. tqctl checkpoint; a second persistent session; then damage p's manifest
ctl checkpoint "$P" | grep -q checkpointed || fail "tqctl checkpoint"
ctl open --layers 1 --kv-heads 1 --q-heads 1 --head-dim 64 --max-tokens 100 --name q --persistent >/dev/null ||
	fail "tqctl open --persistent"
Q=$(ctl sessions --json | python3 -c "import json,sys; print([s['id'] for s in json.load(sys.stdin)['sessions'] if s.get('name')=='q'][0])")
ctl checkpoint "$H" >/dev/null 2>&1 && fail "checkpoint of a session that does not exist succeeded"
stop_daemon TERM
python3 - "$T/spill/sessions/$P.tqm" <<'PY' || fail "could not damage the manifest"
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[len(b) // 2] ^= 0x40
open(p, "wb").write(bytes(b))
PY
start_daemon --config "$T/tqkvd.conf"
wait_up
grep -q "persistent session $P .*dropped: manifest checksum mismatch" "$LOG" ||
	fail "a damaged manifest: no 'dropped' line with the reason"
[ -f "$T/spill/sessions/$P.tqm.dropped" ] || fail "the damaged manifest was not kept aside"
ctl session "$P" >/dev/null 2>&1 && fail "a session with a damaged manifest came back"
[ "$(sess "$Q" persistent)" = True ] || fail "session q did not come back"
[ "$(gstat persistent_dropped)" = 1 ] && [ "$(gstat persistent_restored)" = 1 ] || fail "GetStats restored/dropped"
ctl close "$Q" >/dev/null || fail "close q"
[ -f "$T/spill/sessions/$Q.tqm" ] && fail "closing a persistent session left its manifest"

# 4. a damaged page of a restored session is never served
rm -f "$T/progress.bin"
fill 1 || fail "fill: $(tail -3 "$T/client.out")"
P=$(ctl sessions --json | python3 -c "import json,sys; print([s['id'] for s in json.load(sys.stdin)['sessions'] if s.get('name')=='p'][0])")
stop_daemon TERM
python3 - "$T/spill/spill.dat" "$P" <<'PY' || fail "could not corrupt p's pages"
import struct, sys
path, sid = sys.argv[1], int(sys.argv[2])
slot = (16 << 10) + 4096
n = 0
with open(path, "r+b") as f:
    size = f.seek(0, 2)
    for off in range(0, size, slot):
        f.seek(off)
        h = f.read(80)
        if h[:8] == b"TQKVSPL1" and struct.unpack_from("<Q", h, 24)[0] == sid:
            f.seek(off + 4096 + 100)
            c = f.read(1)
            f.seek(off + 4096 + 100)
            f.write(bytes([c[0] ^ 1]))
            n += 1
sys.exit(0 if n else 1)
PY
start_daemon --config "$T/tqkvd.conf"
wait_up
"$CLIENT" --client verify "$T/run" p "$T/progress.bin" >"$T/verify.out" 2>&1 && fail "damaged pages were served"
grep -q "DATA_LOSS\|lost" "$T/verify.out" || fail "damaged pages: $(cat "$T/verify.out")"
grep -q "checksum mismatch" "$LOG" || fail "damaged pages: no checksum line in the log"
ctl health >/dev/null || fail "the daemon stopped serving"
stop_daemon TERM
[ "$STOP_RC" = 0 ] || fail "final SIGTERM: exit $STOP_RC"
grep -q "Sanitizer" "$LOG" && fail "a sanitizer report in the daemon's log"
echo "persistent sessions: ok ($ROUNDS kill rounds)"
