#!/usr/bin/env bash
# usage: DATA_DIR=... [OUTPUT_DIR=...] [INIT_CHECKPOINT=...] [MODEL_CONFIG=...] [NPROC=N] bash tasks/hyp/run.sh [key=value ...]
# SIZE=large: config_large.yaml, the paper's large model (INIT_CHECKPOINT=ernie-doc-large-en)
exec bash "$(dirname "$0")/../../tools/launch.sh" "$(dirname "$0")/config.yaml" "$@"
