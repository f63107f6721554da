#!/usr/bin/env bash
# The run.sh contract, in one place: every tasks/<name>/run.sh calls
#     bash tools/launch.sh tasks/<name>/config.yaml [key=value ...]
# Environment: DATA_DIR, OUTPUT_DIR (default output/<name>), INIT_CHECKPOINT (empty = from
# scratch), MODEL_CONFIG (preset name or config path), NPROC (>1 → fleetrun data parallel),
# PYTHON. Extra arguments are config overrides. Re-running replaces the run in OUTPUT_DIR
# (pass overwrite_output_dir=false to refuse). Writes OUTPUT_DIR/eval_results.json.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
fail() { echo "error: $*" >&2; exit 2; }
[ $# -ge 1 ] || fail "usage: bash tools/launch.sh tasks/<name>/config.yaml [key=value ...]"
CONFIG=$1
shift
NAME=$(basename "$(dirname "$CONFIG")")
PY=${PYTHON:-python}
OUTPUT_DIR=${OUTPUT_DIR:-output/$NAME}
NPROC=${NPROC:-1}
[[ "$NPROC" =~ ^[1-9][0-9]*$ ]] || fail "NPROC: must be a positive integer, got '$NPROC'"
command -v "$PY" >/dev/null 2>&1 || fail "PYTHON: '$PY' is not an executable"

overrides=("output_dir=$OUTPUT_DIR" "overwrite_output_dir=true")
[ -n "${DATA_DIR:-}" ] && overrides+=("data_dir=$DATA_DIR")
[ -n "${INIT_CHECKPOINT:-}" ] && overrides+=("init_checkpoint=$INIT_CHECKPOINT")
[ -n "${MODEL_CONFIG:-}" ] && overrides+=("model=$MODEL_CONFIG")
overrides+=("$@")

if [ "$NPROC" -gt 1 ]; then
    launcher=(fleetrun)
    command -v fleetrun >/dev/null 2>&1 || launcher=("$PY" -m paddle.distributed.launch)
    exec "${launcher[@]}" --nproc_per_node "$NPROC" --log_dir "${LAUNCH_LOG_DIR:-log/$NAME}" \
        "$ROOT/tools/finetune.py" "$CONFIG" --set "${overrides[@]}"
fi
exec "$PY" "$ROOT/tools/finetune.py" "$CONFIG" --set "${overrides[@]}"
