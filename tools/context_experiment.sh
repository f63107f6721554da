#!/usr/bin/env bash
# The effective-context experiment of docs/results.md: train each recurrence at one budget,
# then measure how far back each model looks (ernie-doc context).
#
#   DATA=/path/to/datasets OUT=out/context bash tools/context_experiment.sh [STEP ...]
#
# STEP: train-demo, train-hyp, train-lm, measure (default: all four, in this order). DATA holds
# hyperpartisan/ (the SemEval files and hp-splits.json) and wikitext103/ (wiki.valid.tokens,
# wiki.test.tokens). Each step runs through tools/ablation.py with --skip-done, so a stopped
# experiment continues where it stopped. Cost on 2 CPU cores: docs/results.md.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python}
OUT=${OUT:-out/context}
DATA=${DATA:?set DATA to the folder holding hyperpartisan/ and wikitext103/}
HYP_EPOCHS=${HYP_EPOCHS:-3}
LM_STEPS=${LM_STEPS:-1000}
DOCS=${DOCS:-64}            # documents of two segments or more each document model reads
LM_TOKENS=${LM_TOKENS:-50000}   # test tokens each language model reads per memory length
LM_MEM_LENS=${LM_MEM_LENS:-0,16,32,64,128,192,256,384,512}   # memory lengths allowed at test
STEPS=("$@")
[ ${#STEPS[@]} -gt 0 ] || STEPS=(train-demo train-hyp train-lm measure)

SMALL='model_overrides={num_hidden_layers: 2, hidden_size: 128, num_attention_heads: 4, memory_len: 64}'

train_demo() {
    OUTPUT_DIR="$OUT/demo" PYTHON="$PY" bash "$ROOT/tasks/longdep/run.sh"
}

train_hyp() {   # the README's small from-scratch recipe, at HYP_EPOCHS, two seeds per recurrence
    local variants=()
    for seed in 1 2; do
        for r in none xl enhanced; do
            variants+=(--variant "$r-s$seed" "recurrence=$r" "seed=$seed")
        done
    done
    "$PY" "$ROOT/tools/ablation.py" "$ROOT/tasks/hyp/config.yaml" --output-dir "$OUT/hyp" \
        --skip-done --jobs 1 "${variants[@]}" \
        --set "data_dir=$DATA/hyperpartisan" model=ernie-doc-small "$SMALL" max_seq_len=128 \
        stride=126 batch_size=16 learning_rate=3e-4 "epochs=$HYP_EPOCHS" tokenizer=train \
        tokenizer_vocab_size=4000 threads=1
}

train_lm() {    # tasks/wikitext103/config_small.yaml at LM_STEPS, one seed per recurrence
    "$PY" "$ROOT/tools/ablation.py" "$ROOT/tasks/wikitext103/config_small.yaml" \
        --output-dir "$OUT/lm" --skip-done --jobs 1 \
        --variant none recurrence=none --variant xl recurrence=xl \
        --variant enhanced recurrence=enhanced \
        --set "data_dir=$DATA/wikitext103" "max_steps=$LM_STEPS" save_steps=500
}

measure() {     # each group on the same documents: its runs' dev split, or the test file
    local cli=("$PY" -m ernie_doc.cli context --overwrite)
    mkdir -p "$OUT/measure"
    "${cli[@]}" "$OUT"/demo/{none,xl,enhanced,enhanced+retro} --format task --split dev \
        --documents "$DOCS" --output "$OUT/measure/demo"
    "${cli[@]}" "$OUT"/hyp/{none,xl,enhanced}-s{1,2} --format task --split dev \
        --documents "$DOCS" --output "$OUT/measure/hyp"
    "${cli[@]}" "$OUT"/lm/{none,xl,enhanced} --input "$DATA/wikitext103/wiki.test.tokens" \
        --max-tokens "$LM_TOKENS" --mem-lens "$LM_MEM_LENS" --output "$OUT/measure/lm"
}

for step in "${STEPS[@]}"; do
    case $step in
        train-demo) train_demo ;;
        train-hyp) train_hyp ;;
        train-lm) train_lm ;;
        measure) measure ;;
        *) echo "error: unknown step '$step' (train-demo, train-hyp, train-lm, measure)" >&2
           exit 2 ;;
    esac
done
