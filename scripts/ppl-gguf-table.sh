#!/usr/bin/env bash
# ppl-gguf-table.sh — BENCHMARKS.md §4a: SmolLM2-135M-Instruct (GGUF,
# scripts/get-models.sh) scored like llama-perplexity (chunks of 512, the
# second half of each scored) on ../shared/data/tinystories-dev.txt, for
# each K/V codec pair and each K/V transform mode, against the exact fp32
# cache; a markdown table on stdout.
#
#   scripts/ppl-gguf-table.sh [WINDOWS] [MODES] [PAIRS]
#
# WINDOWS: chunks to score (default 20; "all" for the whole file).
# MODES:   kv_transform modes, space-separated (default "none default").
# PAIRS:   "K/V" pairs, space-separated (default: every pair below).
# Environment: TQ_DATA, BIN, EXTRA (more tqkv-run arguments, e.g. --daemon's
# --run-dir DIR instead of --local).
set -eu
cd "$(dirname "$0")/.."
DATA=${TQ_DATA:-../shared/data}
RUN=${BIN:-build/bin}/tqkv-run
M=build/models/SmolLM2-135M-Instruct.Q4_1.gguf
W=${1:-20}
MODES=${2:-none default}
PAIRS=${3:-f16/f16 q8/q8 q8/tq4 q8/tq3 tq4/tq4 tq4/tq3 tq3/tq3 q4a/q4a}
[ -r "$M" ] || scripts/get-models.sh >/dev/null
WIN=()
[ "$W" = all ] || WIN=(--windows "$W")
# shellcheck disable=SC2086
LOCAL=(${EXTRA:---local})

ppl() { "$RUN" ppl --model "$M" "$DATA/tinystories-dev.txt" ${WIN[@]+"${WIN[@]}"} --json "$@" 2>/dev/null; }
field() { sed -n "s/.*\"$1\":\"\{0,1\}\([^\",}]*\).*/\1/p"; }

ref=$(ppl --local --kv f32)
rppl=$(printf '%s' "$ref" | field ppl)
echo "Exact (fp32 cache): perplexity $rppl over $(printf '%s' "$ref" | field tokens) scored tokens" \
	"($(printf '%s' "$ref" | field windows) chunks of 512; the text is $(printf '%s' "$ref" | field text_tokens) tokens)."
echo
printf '| K / V | bits per value at d = 64 |'
for m in $MODES; do printf ' %s |' "$m"; done
echo
printf '|---|---|'
for _ in $MODES; do printf -- '---|'; done
echo
for pair in $PAIRS; do
	k=${pair%/*} v=${pair#*/}
	line=""
	bpv=""
	for m in $MODES; do
		j=$(ppl "${LOCAL[@]}" --k "$k" --v "$v" --kv-transform "$m")
		p=$(printf '%s' "$j" | field ppl)
		bpv=$(printf '%s' "$j" | field bits_per_value)
		line="$line $(awk -v p="$p" -v r="$rppl" 'BEGIN { printf "%.4f (%+.2f %%)", p, (p / r - 1) * 100 }') |"
	done
	printf '| %s / %s | %.1f |%s\n' "$k" "$v" "$bpv" "$line"
done
