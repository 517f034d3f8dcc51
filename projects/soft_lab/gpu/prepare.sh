#!/usr/bin/env bash
# Here, in the repository root, right before a call of the GPU machine: put into .gpu/
# (ignored by git; the call carries it) what that machine lacks, and the commit it runs.
#   .gpu/whl/   pure-Python wheels for its Python 3.12 (mmengine, mmcv-lite: mmcv without
#               compiled ops, mmdet, mmpretrain, their small dependencies, pytest)
#   .gpu/commit the commit of this checkout (+uncommitted where mmsoft/ differs): the
#               machine gets the working tree without git
# Then, on the machine: source projects/soft_lab/gpu/setup.sh (projects/soft_lab/README.md).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PY="${MMSOFT_VENV:-$PWD/.venv}/bin/python"
[ -x "$PY" ] || PY=python3
mkdir -p .gpu/whl
# wheels only, for CPython 3.12 on x86-64 Linux; no dependencies resolved (the machine has
# torch, numpy and their kin; the list below is what the OpenMMLab packages add)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any -d .gpu/whl \
  mmengine==0.10.7 mmcv-lite==2.1.0 mmdet==3.3.0 mmpretrain==1.2.0 \
  addict termcolor yapf platformdirs pycocotools terminaltables shapely mat4py \
  modelindex model-index ordered-set pytest pluggy iniconfig packaging pygments
rev=$(git rev-parse HEAD)
[ -z "$(git status --porcelain -- mmsoft)" ] || rev="$rev+uncommitted"
echo "$rev" > .gpu/commit
size=$(du -sm .gpu | cut -f1)
echo "prepared .gpu/ for commit $rev: ${size} MiB of the 64 MiB a call carries"
[ "$size" -le 60 ] || { echo "too large to travel beside the working tree"; exit 1; }
