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

missing=""
for p in $PKGS; do
	st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
	case "$st" in
	*"install ok installed"*) ;;
	*) missing="$missing $p" ;;
	esac
done

[ -z "$missing" ] && exit 0

cmd="apt-get install -y --no-install-recommends$missing"
if [ "$(id -u)" -ne 0 ]; then
	echo "tqkvd: missing Debian packages:$missing" >&2
	echo "tqkvd: run as root:  apt-get update && $cmd" >&2
	exit 1
fi
echo "tqkvd: installing missing Debian packages:$missing" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing >&2
