#!/usr/bin/env bash
# The chaos soak's short run (tests/soak/soak.sh; `make soak` runs it long):
# SOAK_SECONDS (default 25; 20 in the sanitizer runs of .ci/run, which keep
# CI inside its time) with SOAK_CLIENTS (default 4) clients.
default=25
[ -n "${SANITIZER:-}" ] && default=20
export SOAK_SECONDS=${SOAK_SECONDS:-$default} SOAK_CLIENTS=${SOAK_CLIENTS:-4}
exec bash "$(dirname "$0")/../soak/soak.sh"
