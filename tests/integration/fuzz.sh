#!/usr/bin/env bash
# The fuzz targets' regression run: every seed in tests/fuzz/seeds/ and 64
# deterministic mutations of each go through each parser (config file,
# tokenizer, checkpoint, persistent sessions' manifests and journals,
# byte-level BPE encoding, GGUF models, the ring's SQEs and hello, control
# requests, spilled pages' headers, K/V transform statistics); a crash or a
# sanitizer report fails.  The real
# model files, when ../shared/data is there, are seeds too (read in place).
set -u
cd "$TQ_SRC"
rc=0
for t in config tokenizer checkpoint persist bpe gguf sqe rpc hello spillhdr xform; do
	bin="$TQ_BUILD/tests/fuzz_$t"
	[ -x "$bin" ] || { echo "missing $bin"; exit 1; }
	extra=()
	case $t in
	tokenizer) [ -f ../shared/data/tok512.bin ] && extra+=(../shared/data/tok512.bin) ;;
	esac
	if out=$("$bin" "tests/fuzz/seeds/$t" "${extra[@]}" 2>&1); then
		echo "fuzz_$t: $(tail -n 1 <<<"$out")"
	else
		echo "fuzz_$t failed:"; tail -n 30 <<<"$out"; rc=1
	fi
done
exit $rc
