#!/usr/bin/env bash
# What every tasks/<name>/run.sh runs:
#     bash tools/launch.sh tasks/<name>/config.yaml [key=value ...]
# Its contract (the environment variables, the overrides) is the usage text below, printed by
# `bash tasks/<name>/run.sh --help` (or -h) after that run.sh's own notes, before the trainer's
# help; nothing is launched then.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# fail, need_python (before anything runs the interpreter: the trainer's --help too), need_nproc
source "$ROOT/tools/checks.sh"
[ $# -ge 1 ] || fail "usage: bash tools/launch.sh tasks/<name>/config.yaml [key=value ...]"
CONFIG=$1
shift
NAME=$(basename "$(dirname "$CONFIG")")
PY=${PYTHON:-python}
# SIZE: a config's large-model variant is <config>_large.yaml beside it (the paper's large rows)
LARGE="${CONFIG%.yaml}_large.yaml"
SUFFIX=""
case ${SIZE:-base} in
    base) ;;
    large)
        [ -f "$LARGE" ] || fail "SIZE=large: no large-model config beside $CONFIG ($LARGE)"
        CONFIG=$LARGE
        SUFFIX=_large ;;
    *) fail "SIZE=$SIZE: expected base or large" ;;
esac

usage() {
    local run_sh size=""
    run_sh="$(dirname "$CONFIG")/run.sh"
    # the run.sh's own notes: its comment lines from the second to the first other line
    [ -f "$run_sh" ] && sed -n '2,/^[^#]/{/^#/{s/^# \{0,1\}//;p;}}' "$run_sh"
    [ -f "$LARGE" ] && size="
  SIZE             base (default) or large: $(basename "$LARGE") instead, the paper's
                   large-model hyper-parameters (its header names the weights to start
                   from); the default OUTPUT_DIR (above) and LAUNCH_LOG_DIR then end
                   in _large"
    cat <<USAGE

Config: $CONFIG
The environment every task's run.sh reads (tools/launch.sh; the notes above say where this
one differs):
  DATA_DIR         the task's data in its official format (data_dir); required unless the
                   config sets it
  OUTPUT_DIR       where the run is written (output_dir; here: ${OUTPUT_DIR:-output/$NAME$SUFFIX});
                   re-running replaces the run there (only what a run writes;
                   overwrite_output_dir=false refuses instead)
  INIT_CHECKPOINT  the weights to start from: a released name (ernie-doc-base-en,
                   ernie-doc-base-zh, ernie-doc-large-en), a checkpoint folder or a run's
                   best/ (init_checkpoint; default: the config's, empty = from scratch)
  MODEL_CONFIG     a preset name or a model config file (model; default: the config's)
  NPROC            processes (default 1); more: data parallel through fleetrun (gloo on CPU,
                   NCCL on GPU), worker logs in LAUNCH_LOG_DIR (default: log/$NAME$SUFFIX)
  PYTHON           the interpreter (default: python)$size
Arguments: config overrides, key=value (the values are YAML; dotted keys for the maps:
model_overrides.recurrence=xl); \`ernie-doc finetune --help-config\` lists every key.
A run writes OUTPUT_DIR/eval_results.json, best/ (for predict) and its logs.
USAGE
    need_python
    printf '\nThe trainer (tools/finetune.py; the overrides are its --set):\n'
    "$PY" "$ROOT/tools/finetune.py" --help
}
for arg in "$@"; do
    case $arg in -h|--help) usage; exit ;; esac
done

OUTPUT_DIR=${OUTPUT_DIR:-output/$NAME$SUFFIX}
NPROC=${NPROC:-1}
need_nproc
need_python

overrides=("output_dir=$OUTPUT_DIR" "overwrite_output_dir=true")
[ -n "${DATA_DIR:-}" ] && overrides+=("data_dir=$DATA_DIR")
[ -n "${INIT_CHECKPOINT:-}" ] && overrides+=("init_checkpoint=$INIT_CHECKPOINT")
[ -n "${MODEL_CONFIG:-}" ] && overrides+=("model=$MODEL_CONFIG")
overrides+=("$@")

if [ "$NPROC" -gt 1 ]; then
    launcher=(fleetrun)
    command -v fleetrun >/dev/null 2>&1 || launcher=("$PY" -m paddle.distributed.launch)
    exec "${launcher[@]}" --nproc_per_node "$NPROC" --log_dir "${LAUNCH_LOG_DIR:-log/$NAME$SUFFIX}" \
        "$ROOT/tools/finetune.py" "$CONFIG" --set "${overrides[@]}"
fi
exec "$PY" "$ROOT/tools/finetune.py" "$CONFIG" --set "${overrides[@]}"
