#!/bin/sh
# Install the Debian packages tqkvd needs to build and test, if any are missing.
# As root: runs apt-get.  Otherwise: prints the exact command and fails.
set -eu

# build + run-time dependencies (fixed by the product's users; libisal: crc32c
# of spilled pages, hardware-accelerated on x86-64 and aarch64); procps gives
# /bin/kill, which the unit's ExecReload uses; g++: nvcc's host compiler and the
# CUDA kernels' CPU emulator (tests/simt)
PKGS="gcc g++ make pkg-config procps
liburing-dev libnuma-dev libprotobuf-c-dev protobuf-c-compiler
libgrpc-dev libsystemd-dev libinih-dev libisal-dev"
# test tools: systemd-analyze (unit verification), valgrind (leak checks),
# python3 (the integration scripts read JSON and listen on NOTIFY_SOCKET;
# python3-venv: the CUDA toolkit wheels when there is no /usr/local/cuda)
PKGS="$PKGS systemd valgrind python3 python3-venv"

# Optional: the aarch64 cross toolchain and qemu-user, for the aarch64 check
# in `make test` (tests/integration/aarch64.sh: kernels/ and their tests built
# for the DGX Spark's CPU and run under emulation).  If they cannot be
# installed the build goes on and that test says it was skipped and why.
OPT_PKGS="gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static"

missing_of() {
	m=""
	for p in "$@"; do
		st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
		case "$st" in
		*"install ok installed"*) ;;
		*) m="$m $p" ;;
		esac
	done
	echo "$m"
}
# shellcheck disable=SC2086
missing=$(missing_of $PKGS)
# shellcheck disable=SC2086
opt_missing=$(missing_of $OPT_PKGS)

[ -z "$missing" ] && [ -z "$opt_missing" ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
	[ -n "$opt_missing" ] &&
		echo "tqkvd: optional (the aarch64 check): apt-get install -y --no-install-recommends$opt_missing" >&2
	[ -z "$missing" ] && exit 0
	echo "tqkvd: missing Debian packages:$missing" >&2
	echo "tqkvd: run as root:  apt-get update && apt-get install -y --no-install-recommends$missing" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
if [ -n "$missing" ]; then
	echo "tqkvd: installing missing Debian packages:$missing" >&2
	# shellcheck disable=SC2086
	apt-get install -y -qq --no-install-recommends $missing >&2
fi
if [ -n "$opt_missing" ]; then
	echo "tqkvd: installing the aarch64 cross toolchain and qemu-user:$opt_missing" >&2
	# shellcheck disable=SC2086
	apt-get install -y -qq --no-install-recommends $opt_missing >&2 ||
		echo "tqkvd: could not install$opt_missing: the aarch64 check will be skipped" >&2
fi
exit 0
