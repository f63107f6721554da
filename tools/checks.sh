# Sourced by tools/launch.sh and by a run.sh that does not go through it (tasks/longdep): the
# checks of the environment every run.sh reads, each one line and exit 2 before anything runs.
# Uses PY (the interpreter, from PYTHON) and NPROC.
fail() { echo "error: $*" >&2; exit 2; }
need_python() { command -v "$PY" >/dev/null 2>&1 || fail "PYTHON: '$PY' is not an executable"; }
need_nproc() {
    [[ "$NPROC" =~ ^[1-9][0-9]*$ ]] || fail "NPROC: must be a positive integer, got '$NPROC'"
}
