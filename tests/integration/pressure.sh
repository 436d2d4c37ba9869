#!/usr/bin/env bash
# pressure — a production model and a test model on one box, with real
# processes: one tqkvd whose pool is too small for both; tenant prod
# (guarantee = what its jobs need, priority 90) runs tqkv-run generate, then
# a batch of ppl sessions; tenant test (no guarantee, priority 10) runs
# tqkv-run ppl with many interleaved sessions that together want about
# twice the pool.  Checks:
#   - prod's output is bit-identical to a run alone, it never sees an
#     error, and no allocation of its waits longer than pool.admission_wait;
#   - test completes with logits bit-identical to a run alone: its pages
#     were spilled and restored (counted), never lost;
#   - sampled ListTenants never shows a tenant above its limit, and prod is
#     never spilled while it holds no more than its guarantee;
#   - the reverse: test holds the pool, prod grows within its guarantee and
#     gets its pages (test spilled for it), both bit-identical again;
#   - run-time budgets: a limit lowered below use is brought down by the
#     reclaimer; a guarantee raise beyond the pool is refused with why; a
#     SIGHUP with new watermarks takes effect.
# Skips (77) when ../shared/data is absent.
. "$(dirname "$0")/lib/daemon.bash"
DATA=${TQ_DATA:-$TQ_SRC/../shared/data}
M="$DATA/stories260K.bin"
TOK="$DATA/tok512.bin"
X="$DATA/tinystories-dev.txt"
if [ ! -r "$M" ] || [ ! -r "$TOK" ] || [ ! -r "$X" ]; then
	echo "skipped: $DATA (stories260K.bin, tok512.bin, tinystories-dev.txt) is absent"
	exit 77
fi
RUN=$TQ_BIN/tqkv-run

# 4 MiB of 4 KiB pages: one 512-token window of the model is 50 pages
# (200 KiB), so test's 40 windows want 8 MiB, twice the pool.
conf() { # conf HIGH LOW
	cat >"$T/tqkvd.conf" <<CONF
[daemon]
max_clients_per_uid = 128
[pool]
pool_bytes = 4M
page_bytes = 4K
high_watermark = $1
low_watermark = $2
admission_wait = 2s
[tenant prod]
guaranteed = 2M
priority = 90
allow_uids = *
[tenant test]
priority = 10
allow_uids = *
CONF
}
conf 90 80
start_daemon --config "$T/tqkvd.conf"
wait_up

GEN=(generate --model "$M" --tokenizer "$TOK" --run-dir "$T/run" --tenant prod --temperature 0
     --steps 400 --prompt "Once upon a time, there was a little robot")
PPL=(ppl --model "$M" --tokenizer "$TOK" --run-dir "$T/run" "$X")
TEST=("${PPL[@]}" --tenant test --windows 40 --sessions 40)
PROD_BATCH=("${PPL[@]}" --tenant prod --windows 8 --sessions 8)

# tenants FIELD...: "name f1 f2 ..." per tenant, from ListTenants
tenants() {
	ctl tenants --json | python3 -c '
import json, sys
for t in json.load(sys.stdin)["tenants"]:
    print(t["name"], *[t.get(f, 0) for f in sys.argv[1:]])' "$@"
}
# sampler: ListTenants every 50 ms until $T/stop-sampling exists
sampler() {
	rm -f "$T/stop-sampling"
	while [ ! -e "$T/stop-sampling" ]; do
		ctl tenants --json >>"$T/samples" 2>/dev/null && echo >>"$T/samples"
		sleep 0.05
	done
}
check_samples() { # every sample: used <= limit; prod within its guarantee never spilled
	python3 - "$T/samples" <<'PY' || fail "sampled ListTenants broke an invariant (above)"
import json, sys
bad = 0; n = 0
for line in open(sys.argv[1]):
    line = line.strip()
    if not line:
        continue
    n += 1
    for t in json.loads(line)["tenants"]:
        if int(t["used_bytes"]) > int(t["limit_bytes"]):
            print("tenant %s uses %s > limit %s" % (t["name"], t["used_bytes"], t["limit_bytes"])); bad += 1
        if t["name"] == "prod" and int(t.get("spilled_total_bytes", 0)) > 0:
            print("prod was spilled (%s bytes) within its guarantee" % t["spilled_total_bytes"]); bad += 1
print("ok   %d ListTenants samples: no tenant above its limit, prod never spilled" % n)
sys.exit(1 if bad else 0)
PY
}
prod_ok() { # prod_ok PHASE: no refusal, no wait beyond admission_wait (2 s)
	read -r _ waits wait_max refusals evictions < <(tenants waits wait_max_us refusals evictions | grep '^prod ')
	[ "$refusals" = 0 ] && [ "$evictions" = 0 ] || fail "$1: prod refused $refusals times, evicted $evictions"
	[ "$wait_max" -le 2000000 ] || fail "$1: prod waited $wait_max us (> admission_wait 2 s)"
	echo "ok   $1: prod waited $waits times, at most $wait_max us; no refusal"
}

# ---- alone ----------------------------------------------------------------
t0=$(date +%s%N)
"$RUN" "${GEN[@]}" >"$T/prod-alone.txt" 2>"$T/prod-alone.err" || fail "prod alone: $(cat "$T/prod-alone.err")"
t1=$(date +%s%N)
"$RUN" "${TEST[@]}" --logits-out "$T/test-alone.bin" >"$T/test-alone.txt" 2>"$T/test-alone.err" ||
	fail "test alone: $(cat "$T/test-alone.err")"
t2=$(date +%s%N)
"$RUN" "${PROD_BATCH[@]}" --logits-out "$T/prodb-alone.bin" >/dev/null 2>"$T/err" || fail "prod batch alone: $(cat "$T/err")"
read -r _ spilled0 < <(tenants spilled_total_bytes | grep '^test ')
echo "ok   alone: prod generate $(( (t1 - t0) / 1000000 )) ms, test ppl $(( (t2 - t1) / 1000000 )) ms" \
     "(test spilled $spilled0 bytes: its 40 sessions alone exceed the pool)"

# ---- 1. prod generates while test's working set is twice the pool -----------
sampler & SAMPLER=$!
"$RUN" "${TEST[@]}" --logits-out "$T/test-1.bin" >"$T/test-1.txt" 2>"$T/test-1.err" & TESTPID=$!
for _ in $(seq 100); do # until test holds most of the pool
	read -r _ used < <(tenants used_bytes | grep '^test ')
	[ "$used" -gt $((3 << 20)) ] && break
	sleep 0.05
done
"$RUN" "${GEN[@]}" >"$T/prod-1.txt" 2>"$T/prod-1.err" || fail "prod under pressure: $(cat "$T/prod-1.err")"
wait $TESTPID || fail "test under pressure: $(cat "$T/test-1.err")"
touch "$T/stop-sampling"; wait $SAMPLER
text() { grep -v -e '^prompt: ' -e '^KV cache ' "$1"; } # the generated text, without the figures
cmp -s <(text "$T/prod-alone.txt") <(text "$T/prod-1.txt") || fail "prod's text differs from its run alone"
[ "$(text "$T/prod-1.txt" | wc -c)" -gt 200 ] || fail "prod generated too little: $(cat "$T/prod-1.txt")"
cmp -s "$T/test-alone.bin" "$T/test-1.bin" || fail "test's logits differ from its run alone"
echo "ok   1: prod's text and test's $(stat -c %s "$T/test-1.bin")-byte logits are bit-identical to the runs alone"
prod_ok 1
read -r _ spilled restored < <(tenants spilled_total_bytes restored_total_bytes | grep '^test ')
[ "$spilled" -gt 0 ] && [ "$restored" -gt 0 ] || fail "test was never spilled and restored ($spilled / $restored)"
echo "ok   1: test spilled $spilled and restored $restored bytes in all"
check_samples

# ---- 2. the reverse: test holds the pool, prod grows within its guarantee ---
rm -f "$T/samples"
sampler & SAMPLER=$!
"$RUN" "${TEST[@]}" --logits-out "$T/test-2.bin" >/dev/null 2>"$T/test-2.err" & TESTPID=$!
for _ in $(seq 100); do
	read -r _ used < <(tenants used_bytes | grep '^test ')
	[ "$used" -gt $((3 << 20)) ] && break
	sleep 0.05
done
read -r _ tspill0 < <(tenants spilled_total_bytes | grep '^test ')
"$RUN" "${PROD_BATCH[@]}" --logits-out "$T/prodb-2.bin" >/dev/null 2>"$T/err" || fail "prod batch under pressure: $(cat "$T/err")"
read -r _ tspill1 < <(tenants spilled_total_bytes | grep '^test ')
wait $TESTPID || fail "test (reverse): $(cat "$T/test-2.err")"
touch "$T/stop-sampling"; wait $SAMPLER
cmp -s "$T/prodb-alone.bin" "$T/prodb-2.bin" || fail "prod's batch logits differ from its run alone"
cmp -s "$T/test-alone.bin" "$T/test-2.bin" || fail "test's logits differ from its run alone (reverse)"
[ "$tspill1" -gt "$tspill0" ] || fail "test was not spilled while prod grew"
echo "ok   2: prod grew to 8 sessions within its guarantee (test spilled $((tspill1 - tspill0)) bytes meanwhile);" \
     "both bit-identical to the runs alone"
prod_ok 2
check_samples

# ---- 3. budgets at run time --------------------------------------------------
"$RUN" "${TEST[@]}" --logits-out "$T/test-3.bin" >/dev/null 2>"$T/test-3.err" & TESTPID=$!
for _ in $(seq 100); do
	read -r _ used < <(tenants used_bytes | grep '^test ')
	[ "$used" -gt $((2 << 20)) ] && break
	sleep 0.05
done
kill -STOP $TESTPID # its sessions hold their pages, idle
ctl budget set test --limit 1M >/dev/null || fail "lowering test's limit below its use was refused"
for _ in $(seq 50); do
	read -r _ used limit < <(tenants used_bytes limit_bytes | grep '^test ')
	[ "$used" -le "$limit" ] && break
	sleep 0.1
done
[ "$used" -le "$limit" ] || fail "test still uses $used > its lowered limit $limit"
grep -q "reclaim: tenant 'test' session .*above its limit" "$LOG" || fail "no reclaim decision logged for the lowered limit"
ctl budget set test --limit 4M >/dev/null || fail "raising test's limit again"
kill -CONT $TESTPID
wait $TESTPID || fail "test after its limit came back: $(cat "$T/test-3.err")"
cmp -s "$T/test-alone.bin" "$T/test-3.bin" || fail "test's logits differ after its limit was lowered and raised"
OUT=$(ctl budget set test --guaranteed 3M 2>&1) && fail "guarantees beyond the pool accepted: $OUT"
grep -q "would exceed the pool" <<<"$OUT" || fail "refusal without the reason: $OUT"
echo "ok   3: a limit lowered below use is enforced by spilling (test then completes bit-identical);" \
     "guarantees beyond the pool refused ($OUT)"
conf 70 50
kill -HUP "$DAEMON_PID"
for _ in $(seq 50); do [ "$(gstat high_watermark_pct)" = 70 ] && break; sleep 0.1; done
[ "$(gstat high_watermark_pct)" = 70 ] && [ "$(gstat low_watermark_pct)" = 50 ] || fail "SIGHUP: watermarks not reloaded"
echo "ok   3: SIGHUP reloads the watermarks (70 % / 50 %)"
grep -q "reclaim: tenant 'test' session [0-9]* (idle [0-9]* ms): spilled .* (pool [0-9]*% used, above the 90% mark" "$LOG" ||
	fail "no watermark reclaim decision in the log"
echo "reclaim decisions logged: $(grep -c 'reclaim: tenant' "$LOG")"
