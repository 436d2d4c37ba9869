#!/usr/bin/env bash
# ppl-table.sh — the KV-codec quality table of BENCHMARKS.md §4:
# tqkv-run ppl on ../shared/data/tinystories-dev.txt for each K/V codec pair,
# against the exact fp32 cache, as a markdown table on stdout.
#
#   scripts/ppl-table.sh [WINDOWS] [--daemon RUN_DIR]
#
# WINDOWS: non-overlapping 512-token windows to score (default: all).
# --daemon RUN_DIR: the codec rows through a running tqkvd instead of
# --local (the same kernels; the exact row is always --local --kv f32).
set -eu
cd "$(dirname "$0")/.."
DATA=${TQ_DATA:-../shared/data}
RUN=${BIN:-build/bin}/tqkv-run
WIN=()
MODE=(--local)
while [ $# -gt 0 ]; do
	case $1 in
	--daemon) MODE=(--run-dir "$2"); shift 2 ;;
	*) WIN=(--windows "$1"); shift ;;
	esac
done
[ -r "$DATA/stories260K.bin" ] || { echo "ppl-table: $DATA is absent" >&2; exit 1; }

ppl() { "$RUN" ppl --model "$DATA/stories260K.bin" --tokenizer "$DATA/tok512.bin" \
	"$DATA/tinystories-dev.txt" ${WIN[@]+"${WIN[@]}"} --json "$@"; }
field() { sed -n "s/.*\"$1\":\"\{0,1\}\([^\",}]*\).*/\1/p"; }
# bits per value of one codec block at head_dim d, metadata included
bits() { # codec d
	case $1 in
	f32) echo 32 ;; f16) echo 16 ;;
	q8) awk -v d="$2" 'BEGIN { printf "%g", (4 + d) * 8 / d }' ;;
	q4a|tq4) awk -v d="$2" 'BEGIN { printf "%g", (4 + d / 2) * 8 / d }' ;;
	tq3) awk -v d="$2" 'BEGIN { printf "%g", (4 + d * 3 / 8) * 8 / d }' ;;
	tq2) awk -v d="$2" 'BEGIN { printf "%g", (4 + d / 4) * 8 / d }' ;;
	esac
}

ref=$(ppl --local --kv f32)
rppl=$(printf '%s' "$ref" | field ppl)
tokens=$(printf '%s' "$ref" | field tokens)
windows=$(printf '%s' "$ref" | field windows)
echo "Scored tokens: $tokens in $windows windows of 512 (text: $(printf '%s' "$ref" | field text_tokens) tokens)."
echo
echo "| K | V | bits/value K + V at d = 8 (mean) | KV bytes / token (5 layers) | perplexity | vs exact | bits/value at d = 128 (mean) |"
echo "|---|---|---|---|---|---|---|"
printf '| f32 | f32 (exact) | 32 + 32 (32) | %s | %.4f | — | 32 + 32 (32) |\n' \
	"$(( $(printf '%s' "$ref" | field kv_bytes) / 512 ))" "$rppl"
for kv in "f16 f16" "q8 q8" "q8 tq4" "q8 tq3" "tq4 tq4" "tq4 tq3" "tq3 tq3" "tq2 tq2" "q4a q4a"; do
	set -- $kv
	j=$(ppl "${MODE[@]}" --k "$1" --v "$2")
	p=$(printf '%s' "$j" | field ppl)
	b=$(printf '%s' "$j" | field kv_bytes)
	printf '| %s | %s | %s + %s (%s) | %s | %.4f | %+.2f %% | %s + %s (%s) |\n' "$1" "$2" \
		"$(bits "$1" 8)" "$(bits "$2" 8)" "$(awk -v a="$(bits "$1" 8)" -v b="$(bits "$2" 8)" 'BEGIN { printf "%g", (a + b) / 2 }')" \
		"$((b / 512))" "$p" "$(awk -v p="$p" -v r="$rppl" 'BEGIN { printf "%.4f", (p / r - 1) * 100 }')" \
		"$(bits "$1" 128)" "$(bits "$2" 128)" "$(awk -v a="$(bits "$1" 128)" -v b="$(bits "$2" 128)" 'BEGIN { printf "%g", (a + b) / 2 }')"
done
