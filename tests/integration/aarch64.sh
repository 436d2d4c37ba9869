#!/usr/bin/env bash
# kernels/ and their unit tests built for aarch64 (the DGX Spark's CPU) with
# the cross toolchain and run under qemu-user: the portable paths, the NEON
# codec (bytes identical to the reference) and NEON attention (against the
# oracle), and the golden hashes that pin rotations, codebooks and encoded
# blocks to the same bits on every machine (scripts/check-aarch64.sh, quick: the long
# statistical cases left out).  Skipped, with the reason, when the deps step
# could not install gcc-aarch64-linux-gnu and qemu-user-static.
cd "${TQ_SRC:-$PWD}" || exit 1
# A sanitizer pass (make check SANITIZER=...) would run the same
# uninstrumented cross build again: make test has run it.
if [ -n "${SANITIZER:-}" ]; then
	echo "skipped: SANITIZER=$SANITIZER: the aarch64 build is not instrumented (make test runs it)"
	exit 77
fi
TQ_AARCH64_QUICK=1 exec scripts/check-aarch64.sh
