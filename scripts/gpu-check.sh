#!/usr/bin/env bash
# gpu-check.sh — the GPU tier's checks on a machine with an NVIDIA GPU (issue
# 11): run from the repository root, with the binaries in .gpu/ (made by
# scripts/gpu-bundle.sh on a Debian machine) or, with B=build, a build made
# there.  Each step is bounded by `timeout`; every step's output also goes to
# $OUT/ when OUT is set (the device tool's folder), else to build/gpu-logs/.
#
#   scripts/gpu-check.sh [STEP...]     steps: smi test quick backend benchsmall bench
#                                      benchq8 benchtqo bench8 general ncu sanitize probe
#                                      sparse phases fault shared step ring pages soak (default: smi test
#                                      backend benchsmall bench)
set -u
cd "$(dirname "$0")/.."
if [ -z "${B:-}" ] && [ -f .gpu/build.tar.xz ] && [ ! -d .gpu/build ]; then
	tar -C .gpu -xJf .gpu/build.tar.xz || exit 1
fi
if [ -z "${B:-}" ] && [ -d .gpu/build ]; then
	B=.gpu/build
	export LD_LIBRARY_PATH=$PWD/.gpu/sys${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
B=${B:-build}
[ -z "${TQ_DATA:-}" ] && [ -f .gpu/data/stories260K.bin ] && export TQ_DATA=$PWD/.gpu/data
export TQ_BUILD=$PWD/$B TQ_BIN=$PWD/$B/bin TQ_SRC=$PWD
LOGS=${OUT:-$PWD/build/gpu-logs}
mkdir -p "$LOGS"
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(smi test backend benchsmall bench)
status=0
step() { # name, timeout (s), command...
	local name=$1 limit=$2 t0 rc
	shift 2
	echo "=== $name: $*"
	t0=$SECONDS
	timeout "$limit" "$@" > >(tee "$LOGS/$name.log") 2>&1
	rc=$?
	echo "=== $name: exit $rc in $((SECONDS - t0)) s"
	[ "$rc" -eq 0 ] || status=1
}
for s in "${steps[@]}"; do
	case $s in
	smi)        step smi 30 nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv ;;
	test)       step test_cuda 150 "$B/tests/test_cuda" ;;
	quick)      step test_cuda_quick 120 env TQ_CUDA_QUICK=1 "$B/tests/test_cuda" ;;
	backend)    step gpu_backend 100 bash tests/integration/gpu_backend.sh ;;
	benchsmall) step bench_cuda 60 bash tests/integration/bench_cuda.sh ;;
	bench)      step bench 200 "$B/bin/tqbench" attn --backend cuda ;;
	benchq8)    step bench_q8_tq4 200 "$B/bin/tqbench" attn --backend cuda --k q8 --v tq4 --no-baseline ;;
	benchtqo)   # tq4o keys on attn_mma and enc_reg, then on the general kernels (their baseline), one lease
	            step bench_tq4o_tq3 200 "$B/bin/tqbench" attn --backend cuda --k tq4o --v tq3 --no-baseline \
	                 --ctx 8192,32768 --batch 1,16
	            step bench_tq4o_tq3_general 200 env TQ_CUDA_ATTN=general TQ_CUDA_ENC=general \
	                 "$B/bin/tqbench" attn --backend cuda --k tq4o --v tq3 --no-baseline --ctx 8192,32768 --batch 1,16 ;;
	bench8)     step bench_ctas8 200 env TQ_CUDA_CTAS_PER_SM=8 "$B/bin/tqbench" attn --backend cuda --no-baseline ;;
	general)    step bench_general 200 env TQ_CUDA_ATTN=general "$B/bin/tqbench" attn --backend cuda --no-baseline ;;
	ncu)        step ncu 150 ncu --kernel-name regex:attn_mma --launch-skip 5 --launch-count 1 \
	                 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
	                 --section MemoryWorkloadAnalysis \
	                 "$B/bin/tqbench" attn --backend cuda --ctx 32768 --batch 1 --reps 3 --no-baseline --layers 2 --bulk 64 ;;
	probe)      step launch_probe 60 "$B/tests/launch_probe" ;;
	fault)      step cuda_fault 60 "$B/tests/test_cuda_fault" ;;
	sparse)     # sparse-V on sharp attention: each batch exact, then at 0.01, in one run
	            step bench_sparse 200 "$B/bin/tqbench" attn --backend cuda --ctx 32768,131072 --batch 1,16 \
	                 --sparse 0.01 --q-scale 16 --no-baseline --check-max 32768 ;;
	shared)     # 16 concurrent sessions: the shared-GPU splits (default) against the lone plan
	            # (TQ_CUDA_SPLIT_SHARED=512: off), alternated twice, same lease
	            for i in 1 2; do
	                for mode in on off; do
	                    step "shared_${mode}_$i" 150 env $([ $mode = off ] && echo TQ_CUDA_SPLIT_SHARED=512) \
	                         "$B/bin/tqbench" attn --backend cuda --ctx 16384,32768,65536 --batch 16 --reps 20 \
	                         --no-baseline --check-max 32768 --layers 1 --bulk 64
	                done
	            done ;;
	pages)      # the tiled kernel on 64-token pages (tqkvd's at 64 KiB pages, 8 KV heads, tq4/tq3)
	            # against 256-token ones, alternated twice
	            for i in 1 2; do
	                for pt in 64 256; do
	                    step "pages_${pt}_$i" 120 "$B/bin/tqbench" attn --backend cuda --ctx 8192,32768,131072 \
	                         --batch 1 --page-tokens $pt --reps 50 --no-baseline --check-max 32768 --layers 1 --bulk 64
	                done
	            done ;;
	ring)       # the decode step through tqkvd on a GPU pool against the same call with no ring
	            step ring_8k 120 "$B/bin/tqbench" ring --backend cuda --ctx 8192 --clients 8 --iters 2000
	            step ring_32k 120 "$B/bin/tqbench" ring --backend cuda --ctx 32768 --clients 8 --iters 1000 ;;
	soak)       # the chaos soak on a GPU pool (outputs within the GPU kernels' contract)
	            step soak_gpu 240 env TQ_POOL_BACKEND=cuda SOAK_SECONDS=150 SOAK_CLIENTS=4 bash tests/soak/soak.sh ;;
	step)       # a layer's decode step as two calls and as one (tqc_append_attend), and a
	            # decode token's append alone into each of 32 layers
	            step bench_step 150 "$B/bin/tqbench" attn --backend cuda --ctx 8192,32768,131072 --batch 1 \
	                 --reps 50 --no-baseline --check-max 32768 --layers 32 --bulk 64 ;;
	phases)     # where attn_mma's time goes (tqbench-phases, `make phases`: kernels with the phase clocks)
	            if [ -x "$B/bin/tqbench-phases" ]; then
	                step phases 200 "$B/bin/tqbench-phases" attn --backend cuda --ctx 8192,32768,131072 --batch 1 \
	                     --reps 20 --no-baseline --check-max 32768 --phases 20 --layers 1 --bulk 64
	            else
	                echo "=== phases: no $B/bin/tqbench-phases (make phases)"; status=1
	            fi ;;
	sanitize)   step sanitize 300 compute-sanitizer --tool memcheck --leak-check full \
	                 env TQ_CUDA_QUICK=1 "$B/tests/test_cuda" ;;
	*) echo "gpu-check: unknown step '$s' (smi test quick backend benchsmall bench benchq8 benchtqo bench8 general ncu sanitize probe sparse phases fault shared step ring pages soak)" >&2; exit 2 ;;
	esac
done
exit $status
