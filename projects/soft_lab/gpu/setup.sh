# Sourced on the GPU machine, in the repository root, with .gpu/ carried (prepare.sh):
#   source projects/soft_lab/gpu/setup.sh && python3 projects/soft_lab/device_report.py ...
# Installs the carried wheels into /tmp/site (the machine reaches no registry) and puts it
# and the repository root first on PYTHONPATH.
SITE=/tmp/site
if [ ! -d "$SITE/mmengine" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .gpu/whl/*.whl \
    || return 1
  # mmcv-lite has no compiled ops, but mmcv.ops loads them at import (mmdet imports it)
  cp projects/soft_lab/gpu/mmcv_ext_stub.py "$SITE/mmcv/_ext.py"
  # mmpretrain 1.2.0 imports importlib_metadata (the standard library's importlib.metadata
  # serves) and, beside transformers 5, fails importing its multimodal models (unused here)
  printf 'from importlib.metadata import *  # noqa\nfrom importlib.metadata import PackageNotFoundError, distribution  # noqa\n' \
    > "$SITE/importlib_metadata.py"
  sed -i 's/^if WITH_MULTIMODAL:/if False:  # transformers 5: not imported/' \
    "$SITE/mmpretrain/models/multimodal/__init__.py"
fi
export PYTHONPATH="$SITE:$PWD" PYTHONUNBUFFERED=1
