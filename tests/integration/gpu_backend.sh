#!/usr/bin/env bash
# pool.backend = cuda, with and without a GPU.
#
# Everywhere (a GPU or not, CUDA built or not):
#   1. with no usable GPU, pool.backend = cuda refuses to start and the log
#      says why (no driver, no such device, built without CUDA) and what to
#      set instead; `tqkvd --gpus` says the same and exits 1;
#   2. pool.backend_fallback = yes starts on host memory, says so, and the
#      data path is bit-exact as on any host pool; on the emulator, a start
#      that failed after making its CUDA context destroys it;
#   3. a device index that does not exist is refused by name.
# With a usable GPU: the data-path suite (datapath.sh) on a GPU pool; and a
# tenant's sparse-V on the GPU's kernels (said at start-up, values skipped
# and counted by tqctl, the real model's perplexity as the exact tenant's
# within 1 %).  Without one, where the SIMT emulator is built (x86-64 with
# CUDA, no sanitizer): the same data-path suite on tqkvd-simt, tqkvd whose
# GPU pool is the emulator's (a Fake H100: the real tq_cuda.c and
# backend_cuda.c, the kernels' device code on the CPU).
. "$(dirname "$0")/lib/daemon.bash"
CLIENT=${TQ_BUILD:-$PWD/build}/tests/test_ring
[ -x "$CLIENT" ] || { echo "test_ring not built"; exit 77; }

gpus=$("$TQKVD" --gpus 2>&1); have_gpu=$?
echo "tqkvd --gpus: $gpus"

if [ "$have_gpu" -ne 0 ]; then
	case $gpus in
	"no usable CUDA device: "?*) ;;
	*) fail "tqkvd --gpus without a GPU does not say why: $gpus" ;;
	esac
	# 1. no fallback: start-up fails with the reason
	cat >"$T/cuda.conf" <<CONF
[pool]
pool_bytes = 64M
backend = cuda
CONF
	"$TQKVD" --run-dir "$T/run" --spill-dir "$T/spill" --config "$T/cuda.conf" >"$LOG" 2>&1 &
	DAEMON_PID=$!
	wait "$DAEMON_PID"; rc=$?; DAEMON_PID=
	[ "$rc" -eq 1 ] || fail "pool.backend = cuda without a GPU exited $rc, not 1"
	grep -q "pool.backend = cuda: .*pool.backend_fallback = yes" "$LOG" ||
		fail "start-up failure does not say why and what to do: $(cat "$LOG")"
	reason=${gpus#no usable CUDA device: }
	grep -qF "$reason" "$LOG" || fail "the log does not carry the reason '$reason'"
	[ -e "$T/run/control.sock" ] && fail "a control socket was left behind"

	# 2. fallback: host memory, CPU kernels, said so; bit-exact data path
	cat >>"$T/cuda.conf" <<CONF
backend_fallback = yes
[tenant default]
allow_uids = *
CONF
	: >"$LOG"
	start_daemon --config "$T/cuda.conf"
	wait_up
	grep -q "starting on host memory with the CPU kernels instead (pool.backend_fallback = yes)" "$LOG" ||
		fail "the fallback is not logged"
	[ "$(gstat pool_backend)" = host ] || fail "after the fallback the pool backend is $(gstat pool_backend)"
	"$CLIENT" --client exact-ctl "$T/run" 5 6 "$(gstat page_bytes)" ||
		fail "data path after the fallback is not bit-exact"
	stop_daemon TERM
	[ "$STOP_RC" -eq 0 ] || fail "stop after the fallback exited $STOP_RC"
	echo "no GPU here: refusal, reason and fallback checked"

	# 4 on the emulator: the data-path suite on a GPU pool whose kernels run here
	SIMT_TQKVD=${TQ_BUILD:-$PWD/build}/tests/simt/tqkvd-simt
	if [ -x "$SIMT_TQKVD" ] && [ -z "${SANITIZER:-}" ]; then
		# (held sessions of 256 tokens a layer, not 2048: the emulated
		# GPU's attention is slow, and the held clients keep it busy)
		LD_LIBRARY_PATH=$(dirname "$SIMT_TQKVD")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} TQKVD=$SIMT_TQKVD \
			TQ_POOL_BACKEND=cuda TQ_HOLD_TOKENS=256 bash "$(dirname "$0")/datapath.sh" ||
			fail "the data path on the emulator's GPU pool (tqkvd-simt)"
		echo "the emulator's GPU pool (tqkvd-simt): data-path suite passed"
		# a device too small for the pool (TQ_FAKE_MALLOC_MAX): the start
		# on it fails after its context was made; the fallback destroys
		# that context (it held device memory for nothing) and says so
		: >"$LOG"
		LD_LIBRARY_PATH=$(dirname "$SIMT_TQKVD")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} TQKVD=$SIMT_TQKVD \
			TQ_FAKE_MALLOC_MAX=$((1 << 20)) start_daemon --config "$T/cuda.conf"
		wait_up
		grep -q "out of device memory" "$LOG" || fail "the emulator's small device: no reason: $(cat "$LOG")"
		grep -q "starting on host memory with the CPU kernels instead" "$LOG" || fail "no fallback: $(cat "$LOG")"
		grep -q "fake cudart: cudaDeviceReset" "$LOG" && grep -q "CUDA device 0 released" "$LOG" ||
			fail "the fallback kept the CUDA context: $(cat "$LOG")"
		[ "$(gstat pool_backend)" = host ] || fail "after the fallback the pool backend is $(gstat pool_backend)"
		stop_daemon TERM
		[ "$STOP_RC" -eq 0 ] || fail "stop after the emulator's fallback exited $STOP_RC"
		echo "the emulator's small device: fallback with the context released"
		# a GPU that shares the host's memory (GB10: TQ_FAKE_INTEGRATED)
		# pins the pool there: one beyond MemAvailable is refused, as the
		# host backend refuses it (it was granted, every byte pinned)
		avail_kb=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
		cat >"$T/uni.conf" <<CONF
[pool]
pool_bytes = $(( avail_kb + (1 << 20) ))K
backend = cuda
[tenant default]
allow_uids = *
CONF
		: >"$LOG"
		LD_LIBRARY_PATH=$(dirname "$SIMT_TQKVD")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} TQ_FAKE_INTEGRATED=1 \
			timeout 60 "$SIMT_TQKVD" --run-dir "$T/run" --spill-dir "$T/spill" --config "$T/uni.conf" \
			>"$LOG" 2>&1
		rc=$?
		[ "$rc" -eq 1 ] || fail "a unified-memory pool beyond MemAvailable exited $rc, not 1: $(tail -3 "$LOG")"
		grep -q "shares the host's memory, where the pool's .* would be pinned .*MemAvailable" "$LOG" ||
			fail "the unified-memory refusal does not say why: $(cat "$LOG")"
		echo "the emulator's unified-memory device: a pool beyond MemAvailable refused"
	else
		echo "the GPU pool's data path needs a GPU or the SIMT emulator (x86-64 with CUDA, no sanitizer)"
	fi
	exit 0
fi

# 3. a device that does not exist
n=$(printf '%s\n' "$gpus" | grep -c '^device [0-9]*:')
cat >"$T/nodev.conf" <<CONF
[pool]
pool_bytes = 64M
backend = cuda
device = $n
CONF
timeout 60 "$TQKVD" --run-dir "$T/run" --spill-dir "$T/spill" --config "$T/nodev.conf" >"$LOG" 2>&1
rc=$?
[ "$rc" -eq 1 ] || fail "device $n of $n exited $rc, not 1"
grep -q "pool.backend = cuda: .*device $n" "$LOG" || fail "no reason for device $n: $(cat "$LOG")"

# 4. the data-path suite on the GPU pool
TQ_POOL_BACKEND=cuda bash "$(dirname "$0")/datapath.sh" || fail "the data path on a GPU pool"
echo "GPU pool: data-path suite passed"

# 5. a tenant's sparse-V on the GPU's kernels, with the shared real model
# (stories260K: head dim 8, the general kernel; a key is a chunk): said at
# start-up, values skipped and counted, perplexity as the exact tenant's
DATA=${TQ_DATA:-../shared/data}
RUN=$TQ_BIN/tqkv-run
if [ ! -f "$DATA/stories260K.bin" ] || [ ! -x "$RUN" ]; then
	echo "GPU pool: sparse-V not checked: $DATA/stories260K.bin or $RUN is absent"
	exit 0
fi
cat >"$T/sv.conf" <<CONF
[pool]
pool_bytes = 256M
backend = cuda
[tenant default]
allow_uids = *
[tenant sparse]
allow_uids = *
sparse_v = 0.05
CONF
: >"$LOG"
start_daemon --config "$T/sv.conf"
wait_up
grep -q "tenant 'sparse': sparse-V on: its sessions' attention (the GPU's kernels)" "$LOG" ||
	fail "start-up does not say the sparse tenant's sparse-V runs on the GPU: $(cat "$LOG")"
ppl_of() { # TENANT: the perplexity of two windows of the text
	"$RUN" ppl --model "$DATA/stories260K.bin" --tokenizer "$DATA/tok512.bin" "$DATA/tinystories-dev.txt" \
		--windows 2 --chunk 48 --tenant "$1" --run-dir "$T/run" --json |
		python3 -c 'import json, sys; print(json.load(sys.stdin)["ppl"])'
}
p_exact=$(ppl_of default) || fail "ppl in the exact tenant on the GPU pool"
p_sv=$(ppl_of sparse) || fail "ppl in the sparse tenant on the GPU pool"
read -r chunks skipped dchunks <<<"$(ctl tenants --json | python3 -c '
import json, sys
t = {x["name"]: x for x in json.load(sys.stdin)["tenants"]}
print(int(t["sparse"]["value_chunks"]), int(t["sparse"]["value_chunks_skipped"]), int(t["default"]["value_chunks"]))')"
[ -n "$chunks" ] && [ "$chunks" -gt 0 ] && [ "$skipped" -gt 0 ] && [ "$skipped" -lt "$chunks" ] ||
	fail "sparse tenant on the GPU: $skipped of $chunks value chunks skipped"
[ "$dchunks" -eq 0 ] || fail "the exact tenant counted $dchunks value chunks (the GPU counts only with sparse-V on)"
python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if abs(b - a) <= 0.01 * a else 1)" \
	"$p_exact" "$p_sv" || fail "sparse_v = 0.05 moved the perplexity from $p_exact to $p_sv"
stop_daemon TERM
[ "$STOP_RC" -eq 0 ] || fail "stop exited $STOP_RC"
echo "GPU pool: sparse-V skipped $skipped of $chunks value chunks; perplexity $p_sv, exact $p_exact"
