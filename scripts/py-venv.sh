#!/usr/bin/env bash
# Prints a python3 that has numpy and gguf (the evaluation scripts' and the
# GGUF reference test's: scripts/ref-dequant.py, scripts/ref-forward.py):
# the system's when it has both, else a venv under the build tree
# ($TQ_BUILD/py-venv, default build/py-venv), made once with pinned
# versions from PyPI.  Never in the daemon's or the client library's run
# time.  `make test` runs it beside the build (make prefetch), so that the
# download overlaps the compilers rather than a test's slot.
#
# Exit 0: the path printed.  77: neither can be had (the log's last line
# says why); tests that need them skip.
set -u
cd "$(dirname "$0")/.."
if python3 -c 'import numpy, gguf' 2>/dev/null; then
	command -v python3
	exit 0
fi
build=${TQ_BUILD:-$PWD/build}
venv="$build/py-venv"
log="${TMPDIR:-/tmp}/tq-py-venv.$$.log"
if ! "$venv/bin/python" -c 'import numpy, gguf' 2>/dev/null; then
	mkdir -p "$build"
	if ! { python3 -m venv "$venv" && "$venv/bin/pip" install -q --disable-pip-version-check \
		numpy==2.2.6 gguf==0.19.0; } >"$log" 2>&1; then
		echo "numpy/gguf unavailable: $(tail -n 1 "$log")" >&2
		rm -f "$log"
		exit 77
	fi
fi
rm -f "$log"
echo "$venv/bin/python"
