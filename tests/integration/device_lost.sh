#!/usr/bin/env bash
# The pool's GPU lost for good, end to end, on the SIMT emulator: tqkvd
# (tqkvd-simt: the daemon with the emulator's kernels and fake runtime, a
# "GPU" pool on a Fake H100) serves a real model's attention until the fake
# runtime's TQ_FAKE_CUDA_FAULT-th work item meets an illegal address, a
# sticky error as on a GPU.  Then:
#   - the client's operation fails with DEVICE_LOST and says the GPU failed;
#   - the daemon logs the device, the call and the CUDA error, and what is
#     lost, and exits with status 1 (for systemd's Restart=on-failure) within
#     a few seconds, leaving no socket behind.
. "$(dirname "$0")/lib/daemon.bash"
B=${TQ_BUILD:-$PWD/build}
SIMT_TQKVD=$B/tests/simt/tqkvd-simt
DATA=${TQ_DATA:-../shared/data}
RUN=$TQ_BIN/tqkv-run
if [ -n "${SANITIZER:-}" ]; then
	echo "skipped: SANITIZER=$SANITIZER: the emulator is built only without sanitizers (make test runs it)"
	exit 77
fi
[ -x "$SIMT_TQKVD" ] || { echo "skipped: tqkvd-simt is built only in x86-64 builds with CUDA"; exit 77; }
[ -x "$RUN" ] || { echo "tqkv-run not built"; exit 1; }
[ -f "$DATA/stories260K.bin" ] || { echo "skipped: no $DATA/stories260K.bin (../shared/data)"; exit 77; }

# one worker: the Nth work item is the same every run
cat >"$T/gpu.conf" <<CONF
[daemon]
data_workers = 1
attention_threads = 1
[pool]
pool_bytes = 64M
backend = cuda
[tenant default]
allow_uids = *
CONF
TQKVD=$SIMT_TQKVD
export LD_LIBRARY_PATH=$B/tests/simt${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
TQ_FAKE_CUDA_FAULT=40 start_daemon --config "$T/gpu.conf"
wait_up
grep -q "on CUDA device 0: Fake H100" "$LOG" || fail "not on the emulator's GPU pool: $(cat "$LOG")"

# a real model through the daemon until the fault
out=$(timeout 120 "$RUN" ppl --model "$DATA/stories260K.bin" --tokenizer "$DATA/tok512.bin" \
	"$DATA/tinystories-dev.txt" --windows 1 --chunk 32 --run-dir "$T/run" 2>&1) &&
	fail "tqkv-run passed across the device fault: $out"
echo "client: $(tail -n 1 <<<"$out")"
grep -q "the pool's GPU failed (its context is lost)" <<<"$out" || fail "the client was not told the GPU failed: $out"

# the daemon stops by itself, with status 1
for _ in $(seq 100); do kill -0 "$DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
kill -0 "$DAEMON_PID" 2>/dev/null && fail "tqkvd still runs 10 s after the device fault"
wait "$DAEMON_PID"; rc=$?; DAEMON_PID=
[ "$rc" -eq 1 ] || fail "tqkvd exited $rc after the device fault, not 1"
grep -q "err: CUDA device 0 failed (.*cudaErrorIllegalAddress): its context is lost" "$LOG" ||
	fail "the log does not name the device, the call and the error"
grep -q "DEVICE_LOST\|the pool's GPU failed" "$LOG" || fail "the failed operation is not in the log"
grep -q "stopping with exit status 1, for systemd (Restart=on-failure)" "$LOG" || fail "the log does not say why it stops"
[ -e "$T/run/control.sock" ] && fail "a control socket was left behind"
[ -e "$T/run/data.sock" ] && fail "a data socket was left behind"
echo "device lost: the client got DEVICE_LOST, tqkvd said why and exited 1"
