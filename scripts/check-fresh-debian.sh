#!/bin/sh
# Run `make test` the way a new user would: on a fresh Debian 12 (a
# debootstrap minbase chroot with only `make` added), from this checkout's
# committed tree and ../shared beside it.  Proves the install step
# (scripts/install-deps.sh) names every package the build and the tests
# need.  Needs root, debootstrap and Debian's mirror; takes a few minutes.
# Not part of `make test`.
set -eu
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "check-fresh-debian: run as root" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "check-fresh-debian: apt-get install debootstrap" >&2; exit 77; }
MIRROR=${MIRROR:-http://deb.debian.org/debian}
top=$(mktemp -d /tmp/tqkvd-fresh.XXXXXX)
R=$top/root
cleanup() {
	for m in dev/pts dev proc; do umount "$R/$m" 2>/dev/null || true; done
	rm -rf "$top"
}
trap cleanup EXIT INT TERM
debootstrap --variant=minbase bookworm "$R" "$MIRROR" >"$top/debootstrap.log" 2>&1 ||
	{ tail -n 20 "$top/debootstrap.log"; exit 1; }
mkdir -p "$R/work/main"
git archive HEAD | tar -x -C "$R/work/main"
[ -d ../shared ] && cp -r ../shared "$R/work/shared"
cp /etc/resolv.conf "$R/etc/resolv.conf"
mount -t proc proc "$R/proc"
mount --bind /dev "$R/dev"
mount --bind /dev/pts "$R/dev/pts"
chroot "$R" /bin/sh -c 'export DEBIAN_FRONTEND=noninteractive;
	apt-get update -qq && apt-get install -y -qq make >/dev/null &&
	cd /work/main && make test'
