#!/usr/bin/env bash
# The package as a user installs it: build a wheel of this tree, install it into a fresh venv
# in DIR (outside the checkout) with requirements.txt's pins, and run .ci/smoke.py there, from
# DIR/work, with nothing of the checkout importable.
#
#   .ci/smoke.sh install DIR   wheel + venv; the wheel and its dependencies first, without
#                              paddle (`smoke.py no-paddle`: one line naming the package to
#                              install), then requirements.txt (paddle, visualdl)
#   .ci/smoke.sh run DIR       the smoke itself (every subcommand, a tiny fine-tune, predict,
#                              export, the exported predict, convert, run-document, pipeline)
#   .ci/smoke.sh DIR           both
# PY: the python that makes the venv (default python3). pip's cache makes a rerun fast.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-python3}
case "${1:-}" in
  install|run) stage=$1; shift ;;
  *) stage=all ;;
esac
[ $# -eq 1 ] || { echo "usage: .ci/smoke.sh [install|run] DIR" >&2; exit 2; }
mkdir -p "$1"
DIR=$(cd "$1" && pwd)
case "$DIR/" in "$ROOT"/*) echo "smoke: DIR must be outside the checkout" >&2; exit 2 ;; esac
VENV=$DIR/venv
export PIP_DISABLE_PIP_VERSION_CHECK=1

install() {
  local start src
  start=$(date +%s)
  # the files a clone holds (tracked, and new files not ignored), never a stale build/ or
  # egg-info of the checkout: setuptools would pack whatever build/lib still holds
  src=$DIR/src
  rm -rf "$src" "$DIR/dist" "$VENV"
  mkdir -p "$src"
  (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
     | xargs -0 sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh \
     | tar --null -T - -cf -) | tar -xf - -C "$src"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" wheel -q --no-deps "$src" -w "$DIR/dist"
  # what `pip install ernie-doc-paddle` does: the package and its own dependencies (held to
  # the pinned versions), paddle left to the user
  "$VENV/bin/pip" install -q --no-compile -c "$ROOT/requirements-libs.txt" "$DIR"/dist/*.whl
  mkdir -p "$DIR/work"
  (cd "$DIR/work" && "$VENV/bin/python" -I "$ROOT/.ci/smoke.py" no-paddle)
  "$VENV/bin/pip" install -q --no-compile -r "$ROOT/requirements.txt"
  "$VENV/bin/pip" check
  echo "   wheel built and installed in $(( $(date +%s) - start )) s"
}

run() {
  [ -x "$VENV/bin/ernie-doc" ] || { echo "smoke: no venv in $DIR (run install first)" >&2; exit 2; }
  rm -rf "$DIR/work" && mkdir -p "$DIR/work" "$DIR/home"
  # HOME: no cache or config of the developer's; -I: neither the checkout nor .ci/ on sys.path
  (cd "$DIR/work" && HOME=$DIR/home "$VENV/bin/python" -I "$ROOT/.ci/smoke.py")
}

case $stage in
  install) install ;;
  run) run ;;
  all) install; run ;;
esac
