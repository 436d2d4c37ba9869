#!/usr/bin/env bash
# llama-cpp-ppl.sh — BENCHMARKS.md §4a's llama.cpp column: llama.cpp's own
# quantized KV caches on the same model and text as scripts/ppl-gguf-table.sh,
# scored by its llama-perplexity (chunks of 512 tokens, the second half of
# each scored: the scoring tqkv-run ppl copies).
#
#   scripts/llama-cpp-ppl.sh [CHUNKS] [PAIRS]
#
# CHUNKS: chunks to score (default 20, as ppl-gguf-table.sh's default).
# PAIRS:  "K/V" llama.cpp cache types (default: f16/f16 and the 4- to 8-bit
#         types below).
#
# llama.cpp's source comes from PyPI, vendored in the llama-cpp-python sdist
# (`pip download --no-binary`), and is built for this CPU (CPU backend only,
# no network at run time) under build/llama.cpp/; nothing of it enters the
# repository.  Needs cmake, ninja and g++ (install-deps.sh does not install
# them: this is an evaluation tool, not part of the product).
# Environment: TQ_DATA, LLAMA_CPP_PYTHON_VERSION (default 0.3.36), THREADS.
set -eu
cd "$(dirname "$0")/.."
DATA=${TQ_DATA:-../shared/data}
VER=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
M=build/models/SmolLM2-135M-Instruct.Q4_1.gguf
CHUNKS=${1:-20}
PAIRS=${2:-f16/f16 q8_0/q8_0 q8_0/q4_0 q8_0/iq4_nl q5_1/q5_1 q5_0/q5_0 q4_1/q4_1 iq4_nl/iq4_nl q4_0/q4_0 q4_0/f16}
THREADS=${THREADS:-$(nproc)}
W=build/llama.cpp
SRC=$W/llama_cpp_python-$VER/vendor/llama.cpp
LP=$SRC/build/bin/llama-perplexity

for t in cmake ninja g++; do
	command -v $t >/dev/null || { echo "llama-cpp-ppl: needs $t (apt-get install cmake ninja-build g++)" >&2; exit 1; }
done
[ -r "$M" ] || scripts/get-models.sh >/dev/null
if [ ! -x "$LP" ]; then
	mkdir -p "$W"
	if [ ! -d "$SRC" ]; then
		python3 -m pip --version >/dev/null 2>&1 ||
			{ echo "llama-cpp-ppl: needs pip to fetch the sdist (apt-get install python3-pip)" >&2; exit 1; }
		python3 -m pip download --quiet --no-deps --no-binary :all: -d "$W" "llama-cpp-python==$VER" >&2
		tar -C "$W" -xzf "$W/llama_cpp_python-$VER.tar.gz"
	fi
	echo "llama-cpp-ppl: building llama-perplexity (a few minutes)" >&2
	cmake -S "$SRC" -B "$SRC/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
		-DLLAMA_CURL=OFF -DGGML_OPENMP=OFF -DLLAMA_BUILD_SERVER=OFF >"$W/cmake.log" 2>&1
	ninja -C "$SRC/build" llama-perplexity >"$W/build.log" 2>&1 || { tail -20 "$W/build.log" >&2; exit 1; }
fi

# bits per value at d = 64 (blocks of 32 values)
bits() {
	case $1 in
	f16) echo 16.0 ;; q8_0) echo 8.5 ;; q5_1) echo 6.0 ;; q5_0) echo 5.5 ;;
	q4_1) echo 5.0 ;; q4_0 | iq4_nl) echo 4.5 ;; *) echo "?" ;;
	esac
}
run() {
	"$LP" -m "$M" -f "$DATA/tinystories-dev.txt" -c 512 --chunks "$CHUNKS" -t "$THREADS" -fa on \
		-ctk "$1" -ctv "$2" 2>&1 | sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p'
}

base=$(run f16 f16)
[ -n "$base" ] || { echo "llama-cpp-ppl: llama-perplexity gave no estimate" >&2; exit 1; }
echo "llama.cpp $VER (llama-cpp-python sdist), llama-perplexity -c 512 --chunks $CHUNKS -fa on;" \
	"f16 cache: perplexity $base."
echo
echo "| K / V (llama.cpp cache types) | bits per value (K, V) | perplexity | Δ vs llama.cpp f16 |"
echo "|---|---|---|---|"
for p in $PAIRS; do
	k=${p%/*} v=${p#*/}
	if [ "$p" = f16/f16 ]; then r=$base; else r=$(run "$k" "$v"); fi
	d=$(awk -v a="$r" -v b="$base" 'BEGIN { printf "%+.2f %%", 100 * (a / b - 1) }')
	echo "| $k / $v | $(bits "$k") / $(bits "$v") | $r | $d |"
done
