#!/usr/bin/env bash
# The offline demo (the README's main command): a synthetic task whose label needs two tokens
# placed segments apart, trained four times — recurrence none, xl, enhanced, and enhanced with
# the retrospective feed — then a table of dev accuracy and OUTPUT_DIR/results.json. While the
# variants run, each evaluation and (every 30 s) each variant's step is one line on screen;
# each variant's full log is OUTPUT_DIR/<variant>.log.
#   [OUTPUT_DIR=output/longdep] [NPROC=N] [JOBS=2] bash tasks/longdep/run.sh [key=value ...]
# DATA_DIR is not used (the data is generated); INIT_CHECKPOINT / MODEL_CONFIG are honoured.
# The four runs go through tools/ablation.py, each with the overrides; NPROC is each run's
# processes; JOBS: runs at once (default 2, or 1 with NPROC > 1).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
for arg in "$@"; do   # --help: these notes, then the contract and the trainer's options
    case $arg in -h|--help) exec bash "$ROOT/tools/launch.sh" "$HERE/config.yaml" --help ;; esac
done
PY=${PYTHON:-python}
OUTPUT_DIR=${OUTPUT_DIR:-output/longdep}
NPROC=${NPROC:-1}
source "$ROOT/tools/checks.sh"   # one line, exit 2: as every run.sh through tools/launch.sh
need_nproc
need_python
JOBS=${JOBS:-$([ "$NPROC" -gt 1 ] && echo 1 || echo 2)}   # 2 variants at once on 2 cores

overrides=()
[ -n "${INIT_CHECKPOINT:-}" ] && overrides+=("init_checkpoint=$INIT_CHECKPOINT")
[ -n "${MODEL_CONFIG:-}" ] && overrides+=("model=$MODEL_CONFIG")
overrides+=("$@")
set_args=()
[ ${#overrides[@]} -gt 0 ] && set_args=(--set "${overrides[@]}")

exec "$PY" "$ROOT/tools/ablation.py" "$HERE/config.yaml" --output-dir "$OUTPUT_DIR" \
    --jobs "$JOBS" --nproc "$NPROC" --primary enhanced+retro \
    --variant none recurrence=none retro_feed=false \
    --variant xl recurrence=xl retro_feed=false \
    --variant enhanced recurrence=enhanced retro_feed=false \
    --variant enhanced+retro recurrence=enhanced retro_feed=true \
    "${set_args[@]}"
