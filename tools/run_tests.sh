#!/usr/bin/env bash
# README command 2: set up (or reuse) .venv, then run the test suite.
# Extra arguments go to pytest, e.g. `bash tools/run_tests.sh -m "not slow"`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/tools/setup_env.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/python" -m pytest tests "$@"
