#!/usr/bin/env bash
# The data path through a real tqkvd: libtqkv clients (the test_ring binary
# in its client modes) open sessions over gRPC and run appends and attention
# over the shared-memory ring; results are bit-identical to the kernels
# in-process; a client killed with SIGKILL gives back its pages, arena and
# ephemeral session, as GetStats (tqctl stats --json) shows; a detached
# session survives its client until closed, and is evicted then dropped
# once idle past session_idle_ttl.
#
# TQ_POOL_BACKEND=cuda runs the same suite on a GPU pool (gpu_backend.sh does,
# when a GPU is there): encoded blocks are the same bytes, attention is held
# to the oracle's 1e-3 of the output norm instead of the CPU kernels' bits.
. "$(dirname "$0")/lib/daemon.bash"
CLIENT=${TQ_BUILD:-$PWD/build}/tests/test_ring
[ -x "$CLIENT" ] || { echo "test_ring not built"; exit 77; }
BACKEND=${TQ_POOL_BACKEND:-host}
HOLD_TOKENS=${TQ_HOLD_TOKENS:-2048} # a held session's tokens a layer (test_ring --client hold)
if [ "$BACKEND" = cuda ]; then export TQ_EXPECT_GPU=1; fi

cat >"$T/tqkvd.conf" <<CONF
[pool]
pool_bytes = 256M
backend = $BACKEND
[tenant default]
limit = 128M
allow_uids = *
CONF
start_daemon --config "$T/tqkvd.conf"
wait_up

TOTAL=$(gstat pages_total)
[ "$TOTAL" -gt 0 ] || fail "GetStats has no pool pages"
[ "$(gstat pool_backend)" = "$BACKEND" ] || fail "pool backend is $(gstat pool_backend), not $BACKEND"
case $BACKEND:$(gstat pool_memory) in
"host:host memory" | "cuda:CUDA device "*) ;;
*) fail "GetStats pool_memory is '$(gstat pool_memory)' on a $BACKEND pool" ;;
esac

# 1. bit-exact through the daemon, sessions over the control channel
PAGE=$(gstat page_bytes)
ALIGN=$(gstat page_tokens_align)
case $BACKEND:$ALIGN in
host:0 | cuda:32) ;;
*) fail "GetStats page_tokens_align is $ALIGN on a $BACKEND pool" ;;
esac
"$CLIENT" --client exact-ctl "$T/run" 77 25 "$PAGE" "$ALIGN" || fail "results through tqkvd differ from the kernels"
# the GPU kernels' counters: the client's decode steps (APPEND_ATTEND) ran as
# one call each, the attention queued behind the append where it could be
if [ "$BACKEND" = cuda ]; then
	steps=$(gstat gpu_decode_steps) one=$(gstat gpu_decode_steps_one_wait)
	[ "$steps" -gt 0 ] && [ "$one" -gt 0 ] && [ "$one" -le "$steps" ] ||
		fail "GetStats: $steps decode steps in one call, $one with one wait"
	[ "$(gstat gpu_busy_us)" -gt 0 ] && [ "$(gstat gpu_kernel_failures)" = 0 ] ||
		fail "GetStats: GPU time $(gstat gpu_busy_us) us, $(gstat gpu_kernel_failures) failures"
	ctl stats | grep -q "^GPU kernels: .* decode steps in one call ($one with one wait)" ||
		fail "tqctl stats lacks the GPU kernels line: $(ctl stats)"
	top=$(ctl top -n 2 --interval 0.2)
	[ "$(grep -c '^gpu: .*busy .*decode steps/s (.* with one wait); 0 kernel failures$' <<<"$top")" = 2 ] ||
		fail "tqctl top lacks the gpu line: $top"
	echo "GPU kernels: $steps decode steps in one call, $one with one wait"
else
	[ "$(gstat gpu_decode_steps)" = 0 ] && [ "$(gstat gpu_appends)" = 0 ] || fail "GPU counters on a host pool"
	ctl stats | grep -q "^GPU kernels" && fail "tqctl stats shows GPU kernels on a host pool"
	ctl top -n 1 | grep -q "^gpu: " && fail "tqctl top shows a gpu line on a host pool"
fi
wait_stat data_clients 0
wait_stat used_bytes 0
wait_stat pages_free "$TOTAL"

# tokens a page: all that fit on a host pool, a multiple of 32 on a GPU pool
# (the tiled kernel's tile), and a session whose page holds fewer than 32 on
# a GPU pool is logged with the page_bytes that would do
sid_of() { python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])'; }
A=$(ctl open --tenant default --layers 1 --kv-heads 8 --q-heads 32 --head-dim 128 --max-tokens 64 \
	--k-codec tq4 --v-codec tq3 --json | sid_of) || fail "open 8 x 128 tq4/tq3"
B=$(ctl open --tenant default --layers 1 --kv-heads 32 --q-heads 32 --head-dim 256 --max-tokens 64 \
	--k-codec q8 --v-codec q8 --json | sid_of) || fail "open 32 x 256 q8/q8"
pa=$(ctl session "$A" | sed -n 's/^tokens a page: *//p') pb=$(ctl session "$B" | sed -n 's/^tokens a page: *//p')
case $BACKEND:$pa:$pb in
host:68:3 | cuda:64:3) ;;
*) fail "tokens a page on a $BACKEND pool: $pa (8 x 128 tq4/tq3) and $pb (32 x 256 q8/q8)" ;;
esac
if [ "$BACKEND" = cuda ]; then
	grep -q "session $B: a page of 65536 bytes (pool.page_bytes) holds 3 of its tokens, fewer than 32: .* pages of 532480 bytes or more hold 32" "$LOG" ||
		fail "no warning for session $B's 3-token pages: $(grep "session $B" "$LOG")"
	grep -q "session $A: a page of" "$LOG" && fail "a warning for session $A, whose pages hold 64 tokens"
else
	grep -q "fewer than 32" "$LOG" && fail "a host pool warned of the GPU kernel's tile"
fi
ctl close "$A" >/dev/null && ctl close "$B" >/dev/null || fail "close $A, $B"

# 2. SIGKILL in the middle of operations: everything comes back
"$CLIENT" --client hold "$T/run" ephemeral >"$T/hold.out" 2>&1 &
HOLD=$!
for _ in $(seq 100); do grep -q ready "$T/hold.out" && break; sleep 0.1; done
grep -q ready "$T/hold.out" || fail "client did not get ready: $(cat "$T/hold.out")"
[ "$(gstat data_clients)" = 1 ] || fail "data_clients is not 1"
[ "$(gstat used_bytes)" -gt 0 ] || fail "no bytes charged"
[ "$(gstat pages_free)" -lt "$TOTAL" ] || fail "no pages in use"
[ "$(gstat sessions_open)" = 1 ] || fail "the session is not open"
sleep 0.2
kill -KILL $HOLD
wait $HOLD 2>/dev/null
wait_stat data_clients 0
wait_stat sessions_open 0
wait_stat used_bytes 0
wait_stat pages_free "$TOTAL"
wait_stat data_arena_bytes 0

# 3. a detached session outlives its client; closing it returns the pages
"$CLIENT" --client hold "$T/run" detached worker-7 >"$T/hold2.out" 2>&1 &
HOLD=$!
for _ in $(seq 100); do grep -q ready "$T/hold2.out" && break; sleep 0.1; done
ID=$(awk '/ready/ {print $1}' "$T/hold2.out")
[ -n "$ID" ] || fail "client did not get ready: $(cat "$T/hold2.out")"
kill -KILL $HOLD
wait $HOLD 2>/dev/null
wait_stat data_clients 0
[ "$(gstat sessions_open)" = 1 ] || fail "the detached session was closed with its client"
ctl session "$ID" --json | python3 -c 'import json,sys; d=json.load(sys.stdin); assert int(d["tokens"]) == '"$HOLD_TOKENS"' and int(d["resident_bytes"]) > 0, d' \
	|| fail "session $ID does not show its tokens and resident bytes"
# a restarted worker finds its detached session again by name
out=$("$CLIENT" --client attach-name "$T/run" worker-7 2>&1) || fail "attach by name: $out"
grep -q "session $ID, attend 1 ok" <<<"$out" || fail "attach by name: $out"
out=$("$CLIENT" --client attach-name "$T/run" worker-8 2>&1) && fail "attached a name that does not exist: $out"
grep -q "no session named 'worker-8' in tenant 'default'" <<<"$out" || fail "attach by a wrong name: $out"
# the spill tier: all of its pages to the spill file and back
out=$(ctl spill "$ID") || fail "tqctl spill $ID: $out"
ctl session "$ID" --json | python3 -c 'import json,sys; d=json.load(sys.stdin); assert int(d["resident_bytes"]) == 0 and int(d["spilled_bytes"]) > 0, d' \
	|| fail "after tqctl spill: $(ctl session "$ID" --json)"
wait_stat used_bytes 0
[ "$(gstat spill_used_bytes)" -gt 0 ] || fail "GetStats shows no spill use"
ctl tenants --json | python3 -c 'import json,sys; t=json.load(sys.stdin)["tenants"][0]; assert int(t.get("spilled_bytes", 0)) > 0 and int(t.get("used_bytes", 0)) == 0, t' \
	|| fail "the tenant does not show its spilled bytes: $(ctl tenants --json)"
# a client's prefetch reads them back (asynchronously: it watches them come)
out=$("$CLIENT" --client prefetch "$T/run" "$ID" 2>&1) || fail "prefetch: $out"
grep -q "^after: resident [1-9][0-9]* spilled 0$" <<<"$out" || fail "prefetch: $out"
# operations far too big for the connection's arena: -E2BIG, no crash
out=$("$CLIENT" --client huge "$T/run" "$ID" 2>&1) || fail "huge operations: $out"
out=$(ctl spill "$ID") || fail "tqctl spill $ID (again): $out"
out=$(ctl restore "$ID") || fail "tqctl restore $ID: $out"
ctl session "$ID" --json | python3 -c 'import json,sys; d=json.load(sys.stdin); assert int(d["spilled_bytes"]) == 0 and int(d["resident_bytes"]) > 0, d' \
	|| fail "after tqctl restore: $(ctl session "$ID" --json)"
[ "$(gstat spill_used_bytes)" = 0 ] || fail "slots still in use after the restore"
[ "$(gstat spill_reads)" -gt 0 ] && [ "$(gstat spill_checksum_failures)" = 0 ] || fail "spill stats"
ctl close "$ID" >/dev/null || fail "tqctl close $ID"
wait_stat used_bytes 0
wait_stat pages_free "$TOTAL"

# 4. idle TTL (a reload turns it on): an unused detached session is evicted
# (its pages return), then dropped
EVICTIONS0=$(gstat evictions_total)
printf '[daemon]\nsession_idle_ttl = 1s\n' >>"$T/tqkvd.conf"
kill -HUP "$DAEMON_PID"
wait_for 'reload: done' "$LOG"
"$CLIENT" --client hold "$T/run" detached >"$T/hold3.out" 2>&1 &
HOLD=$!
for _ in $(seq 100); do grep -q ready "$T/hold3.out" && break; sleep 0.1; done
grep -q ready "$T/hold3.out" || fail "client did not get ready: $(cat "$T/hold3.out")"
kill -KILL $HOLD
wait $HOLD 2>/dev/null
# evictions_total, not sessions_evicted: the evicted state lasts one TTL, and
# a slow poll (tqctl under a sanitizer) can miss it
wait_stat evictions_total $((EVICTIONS0 + 1)) 100 "the idle timer evicts the session"
grep -q 'idle timer: 1 session evicted or dropped' "$LOG" || fail "no idle-timer line in the log"
wait_stat used_bytes 0
wait_stat pages_free "$TOTAL"
wait_stat sessions_evicted 0 50
wait_stat sessions_open 0

# the daemon is still healthy and says so in text too
ctl stats | grep -q '^pages: ' || fail "tqctl stats lacks the pages line"
ctl stats | grep -q '^data clients: ' || fail "tqctl stats lacks the data clients line"

# 5. SIGTERM with a client in the middle of operations: the daemon finishes
# what runs, exits 0 promptly, and the client gets errors instead of hanging
"$CLIENT" --client hold "$T/run" ephemeral >"$T/hold4.out" 2>&1 &
HOLD=$!
for _ in $(seq 100); do grep -q ready "$T/hold4.out" && break; sleep 0.1; done
grep -q ready "$T/hold4.out" || fail "client did not get ready: $(cat "$T/hold4.out")"
stop_daemon TERM
[ "$STOP_RC" = 0 ] || fail "tqkvd exited $STOP_RC"
[ "$STOP_MS" -lt 3000 ] || fail "tqkvd took $STOP_MS ms to stop"
for _ in $(seq 30); do kill -0 $HOLD 2>/dev/null || break; sleep 0.1; done
kill -0 $HOLD 2>/dev/null && { kill -KILL $HOLD; fail "the client hung after the daemon stopped"; }
wait $HOLD
HOLD_RC=$?
[ "$HOLD_RC" = 4 ] || fail "the client exited $HOLD_RC, expected 4 (an operation refused): $(cat "$T/hold4.out")"
echo "ok"
