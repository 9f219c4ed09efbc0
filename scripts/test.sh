#!/usr/bin/env bash
# README's test command: install, build, run every test through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
# OpenMPI refuses to start as root unless told; CI runs as root.
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
cd build
ctest --output-on-failure -j"$(nproc)" "$@"
