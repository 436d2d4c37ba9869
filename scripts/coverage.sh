#!/usr/bin/env bash
# make coverage [TESTS="..."]: the tests (all, or those TESTS names) on a
# --coverage build of their own in $B/cov (no CUDA: its host code is
# measured by nothing here), then the lines each file of daemon/, client/
# and kernels/ ran, by gcovr; the table is kept in $B/cov/coverage.txt.
#
# What it cannot see: processes the tests run as other users (hostile_uid.sh,
# multiuser.sh, test_rpc's rights case) cannot write their counts into a
# root-owned tree, so what only they reach reads as not run; the NEON and
# CUDA files are left out (not built here).  As root, gcovr is installed
# when missing (Debian's package); otherwise the command is printed.
set -eu
cd "$(dirname "$0")/.."
B=${B:-build}
COV=$B/cov
if ! command -v gcovr >/dev/null 2>&1; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "coverage: needs gcovr; as root: apt-get install -y --no-install-recommends gcovr" >&2
		exit 1
	fi
	apt-get install -y -qq --no-install-recommends gcovr >&2 ||
		{ apt-get update -qq && apt-get install -y -qq --no-install-recommends gcovr >&2; }
fi
make --no-print-directory -j"$(nproc)" B="$COV" USE_CUDA=no EXTRA_CFLAGS=--coverage LDFLAGS=--coverage all
find "$COV" -name '*.gcda' -delete
rc=0
# the GGUF model stays where get-models.sh keeps it (build/models)
B="$COV" TQ_GGUF_MODEL="${TQ_GGUF_MODEL:-$PWD/build/models/SmolLM2-135M-Instruct.Q4_1.gguf}" \
	tests/run.sh "$@" || rc=$?
gcovr -r . --object-directory "$COV/obj" -f 'daemon/' -f 'client/' -f 'kernels/' \
	-e '.*_neon\.c$' -e '.*cuda.*' -o "$COV/coverage.txt"
cat "$COV/coverage.txt"
echo "coverage: $COV/coverage.txt; the tests $([ "$rc" = 0 ] && echo passed || echo "FAILED (exit $rc)")"
exit "$rc"
