#!/usr/bin/env bash
# README command 2: set up (or reuse) .venv, then run the test suite.
# Extra arguments go to pytest, e.g. `bash scripts/run_tests.sh -m "not slow"`.
# MMSOFT_STACK=onedl runs it in .venv-onedl on the OneDL stack (scripts/setup_env.sh).
#
# One test process per CPU core (pytest-xdist, `-n auto`), each on one thread, as are
# the processes its tests start (tests/conftest.py): a test module runs in one process,
# the longest modules first, so that the processes end together. `-n 0` runs everything
# in this process with torch's own thread count. A passed test's temporary folder is
# deleted when it ends (a run writes gigabytes of checkpoints and work dirs there:
# docs/en/notes/changelog.md); a failed one's stays, as pytest keeps them, under its
# basetemp.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/stack.sh"  # STACK, VENV
bash "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
exec "$VENV/bin/python" -m pytest tests -n auto --dist loadfile --no-loadscope-reorder \
  -o tmp_path_retention_policy=failed "$@"
