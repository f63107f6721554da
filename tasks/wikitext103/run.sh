#!/usr/bin/env bash
# wikitext103 (language modelling, paper §4.1):
#   bash tasks/wikitext103/run.sh                          tiny, offline (config_tiny.yaml)
#   DATA_DIR=/path/to/wikitext-103 [NPROC=8] bash tasks/wikitext103/run.sh     base
#   (batch_size is per process: NPROC=8 batch_size=8 is the paper's batch of 64 rows)
#   CONFIG=config_large.yaml | config_small.yaml picks another config of this folder
# Same contract as every task (tools/launch.sh: OUTPUT_DIR, INIT_CHECKPOINT, MODEL_CONFIG,
# NPROC > 1 → fleetrun, key=value overrides); writes OUTPUT_DIR/eval_results.json (ppl).
HERE=$(dirname "$0")
CONFIG=${CONFIG:-$([ -n "${DATA_DIR:-}" ] && echo config.yaml || echo config_tiny.yaml)}
exec bash "$HERE/../../tools/launch.sh" "$HERE/$CONFIG" "$@"
