#!/usr/bin/env bash
# hotpotqa, two stages:
#   stage 1: DATA_DIR=... [OUTPUT_DIR=output/hotpotqa] bash tasks/hotpotqa/run.sh [key=value ...]
#   stage 2: STAGE=answer DATA_DIR=... [EVIDENCE=<stage-1 OUTPUT_DIR>] \
#            [OUTPUT_DIR=output/hotpotqa_answer] bash tasks/hotpotqa/run.sh [key=value ...]
# STAGE picks config.yaml (evidence, the default) or config_answer.yaml (answer). EVIDENCE
# (stage 2) sets task_options.evidence_file: a stage-1 output directory or predictions file.
# SIZE=large (both stages) picks config_large.yaml / config_answer_large.yaml, the paper's
# large model (INIT_CHECKPOINT=ernie-doc-large-en), and the default OUTPUT_DIRs
# output/hotpotqa_large and output/hotpotqa_answer_large, which stage 2 reads by default.
# Also INIT_CHECKPOINT, MODEL_CONFIG, NPROC, PYTHON as in tools/launch.sh.
set -euo pipefail
HERE=$(dirname "$0")
case "${STAGE:-evidence}" in
    evidence)
        exec bash "$HERE/../../tools/launch.sh" "$HERE/config.yaml" "$@" ;;
    answer)
        export OUTPUT_DIR=${OUTPUT_DIR:-output/hotpotqa_answer$([ "${SIZE:-}" = large ] && echo _large)}
        extra=()
        [ -n "${EVIDENCE:-}" ] && extra+=("task_options.evidence_file=$EVIDENCE")
        exec bash "$HERE/../../tools/launch.sh" "$HERE/config_answer.yaml" "${extra[@]}" "$@" ;;
    *)
        echo "error: STAGE=${STAGE}: expected evidence or answer" >&2
        exit 2 ;;
esac
