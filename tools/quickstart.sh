#!/usr/bin/env bash
# README command 1: set up (or reuse) .venv, generate the mini COCO set if it is missing,
# train the SOFT-Tiny RetinaNet on it from scratch (400 iterations, a few minutes on a
# CPU) and evaluate the final checkpoint with COCO bbox mAP.
#   bash tools/quickstart.sh [CONFIG] [WORK_DIR]
# MMSOFT_STACK=onedl runs it in .venv-onedl on the OneDL stack (tools/setup_env.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CONFIG="${1:-configs/_mini_/retinanet_soft-t_fpn_mini-coco.py}"
WORK_DIR="${2:-work_dirs/quickstart}"
source "$ROOT/tools/stack.sh"  # STACK, VENV
bash "$ROOT/tools/setup_env.sh"
cd "$ROOT"
PY="$VENV/bin/python"
if [ ! -f data/mini_coco/annotations/instances_val.json ] || [ ! -d data/mini_ade ]; then
  "$PY" tools/make_mini_dataset.py --out data
fi
"$PY" tools/train.py "$CONFIG" --work-dir "$WORK_DIR"
CKPT="$(cat "$WORK_DIR/last_checkpoint")"
"$PY" tools/test.py "$CONFIG" "$CKPT" --work-dir "$WORK_DIR/test"
echo "[quickstart] trained checkpoint: $CKPT; metrics above and in $WORK_DIR/test"
