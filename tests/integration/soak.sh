#!/usr/bin/env bash
# The chaos soak's short run (tests/soak/soak.sh; `make soak` runs it long):
# SOAK_SECONDS (default 40) with SOAK_CLIENTS (default 4) clients.
export SOAK_SECONDS=${SOAK_SECONDS:-40} SOAK_CLIENTS=${SOAK_CLIENTS:-4}
exec bash "$(dirname "$0")/../soak/soak.sh"
