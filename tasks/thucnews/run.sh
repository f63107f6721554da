#!/usr/bin/env bash
# usage: DATA_DIR=... [OUTPUT_DIR=...] [INIT_CHECKPOINT=...] [MODEL_CONFIG=...] [NPROC=N] bash tasks/thucnews/run.sh [key=value ...]
exec bash "$(dirname "$0")/../../tools/launch.sh" "$(dirname "$0")/config.yaml" "$@"
