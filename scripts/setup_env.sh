#!/usr/bin/env bash
# Create (or reuse) a virtual environment with an OpenMMLab stack mmsoft supports, and
# install mmsoft into it in editable mode. Two stacks (MMSOFT_STACK):
#   openmmlab (default) -> .venv: the last OpenMMLab releases (2024): mmcv 2.1.0 built from
#       its sdist, mmengine 0.10.7, mmdet 3.3.0, mmsegmentation 1.2.2, mmpretrain 1.2.0,
#       openmim 0.3.9.
#   onedl -> .venv-onedl: their maintained continuation on PyPI (same import names):
#       onedl-mmcv 2.3.6 built from its sdist, onedl-mmengine 0.10.12, onedl-mmdetection
#       3.5.1, onedl-mmsegmentation 1.4.2, onedl-mmpretrain 1.3.6, onedl-mim 0.5.1.
#   Both: torch 2.14.1 + torchvision 0.29.1 and the test tools.
#   oldest -> .venv-oldest: the oldest combination mmsoft claims, the one most mmdet users
#       run: torch 2.1.2 + torchvision 0.16.2 with the openmmlab packages above and
#       numpy < 2 (torch 2.1 was built against numpy 1); mmcv 2.1.0 built unpatched.
# MMSOFT_VENV overrides the folder.
#
# Neither mmcv has a wheel for torch 2.14: it is built here once (minutes; its time per
# stack: docs/en/notes/changelog.md; their setup.py asks for C++14/17, torch's
# headers need C++20, which this script patches) and the wheel is cached in $MMSOFT_CACHE
# (default ~/.cache/mmsoft) for every later run. Where torch sees a GPU the ops are built
# with CUDA (needs nvcc of torch's CUDA major version; the wheel is cached per torch+CUDA
# tag), or the script stops before the build and says what to install; MMSOFT_MMCV_OPS=cpu
# builds CPU-only ops there instead (scripts/setup_plan.py decides).
#
# Idempotent: a second run only checks. Any failure exits non-zero with what to do.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/stack.sh"  # STACK, VENV
CACHE="${MMSOFT_CACHE:-$HOME/.cache/mmsoft}"
PYTHON="${PYTHON:-python3}"

TORCH_VERSION=2.14.1
TORCHVISION_VERSION=0.29.1
CXX_STD=c++20   # what mmcv's setup.py is patched to ('' leaves it as it is)
PINS=""         # requirements resolved with the rest (what this stack's mim pins, ...)

say() { printf '[setup_env] %s\n' "$*"; }
fail() { printf '[setup_env] ERROR: %s\n' "$*" >&2; exit 1; }
case "$STACK" in
  openmmlab)
    MMCV_DIST=mmcv; MMCV_VERSION=2.1.0; MMCV_SDIST=mmcv-2.1.0
    REQUIREMENTS="$ROOT/requirements/runtime.txt"; MIM=openmim==0.3.9
    # torch 2.14 declares setuptools>=77; mmcv's setup.py needs pkg_resources (<82); below
    # 80, `pip install -e .` is a classic develop install (an egg-link to this folder),
    # which is where openmim 0.3.9 looks for mmsoft/.mim/{configs,tools}.
    SETUPTOOLS="setuptools>=77,<80"; MIN_PY=8 ;;
  oldest)
    MMCV_DIST=mmcv; MMCV_VERSION=2.1.0; MMCV_SDIST=mmcv-2.1.0
    REQUIREMENTS="$ROOT/requirements/runtime.txt"; MIM=openmim==0.3.9; PINS="numpy<2"
    TORCH_VERSION=2.1.2; TORCHVISION_VERSION=0.16.2
    # torch 2.1's headers build with the C++17 mmcv's setup.py asks for: no patch.
    CXX_STD=""
    SETUPTOOLS="setuptools<80"; MIN_PY=8 ;;
  onedl)
    MMCV_DIST=onedl-mmcv; MMCV_VERSION=2.3.6; MMCV_SDIST=onedl_mmcv-2.3.6
    REQUIREMENTS="$ROOT/requirements/onedl.txt"; MIM=onedl-mim==0.5.1; PINS="pandas==2.2.3"
    # onedl-mim declares setuptools>=80 (it reads PEP 660 editable installs); the mmcv
    # build still needs pkg_resources (<82).
    SETUPTOOLS="setuptools>=80,<82"; MIN_PY=10 ;;
  *) fail "MMSOFT_STACK must be openmmlab, onedl or oldest, not '$STACK'." ;;
esac
trap 'fail "step failed at line $LINENO (see the output above). Fix the cause and run this script again; it resumes where it stopped."' ERR

"$PYTHON" -c "import sys; assert sys.version_info >= (3, $MIN_PY)" \
  || fail "$PYTHON is missing or older than 3.$MIN_PY (the $STACK stack); set PYTHON=/path/to/python3."

# A new environment takes several GiB (torch and its CUDA libraries; the sizes measured:
# docs/en/notes/changelog.md); NEED_GIB leaves room to spare. Check the disk before
# downloading rather than stop halfway with pip's "No space left on device". An
# environment that already has torch is not checked: what is left to install is small.
NEED_GIB=8
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  DISK="$VENV"
  while [ ! -d "$DISK" ]; do DISK="$(dirname "$DISK")"; done
  FREE_GIB="$(df -Pk "$DISK" | awk 'NR == 2 { print int($4 / 1048576) }')"
  [ "${FREE_GIB:-0}" -ge "$NEED_GIB" ] || fail "the disk holding $VENV has $FREE_GIB GiB free; \
a new $STACK environment needs about $NEED_GIB GiB. Free some space (or set MMSOFT_VENV to \
a folder on another disk) and run this script again."
fi

if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  "$PYTHON" -m venv "$VENV" || fail "could not create $VENV (install python3-venv)."
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)
# After an install pip reports the unmet requirements of what it installed and of what
# depends on that ("ERROR: pip's dependency resolver does not currently take into account
# ..."). mim's opendatalab is unmet on purpose (see the mim step), so every step touching
# mim or its requirements would print that expected ERROR: the steps install with
# --no-warn-conflicts, and one `pip check` at the end reports any other conflict.
INSTALL=("${PIP[@]}" install --no-warn-conflicts)

# Fast path: everything already installed and importable, from the requirement files as
# they are now (.mmsoft-setup-ok holds their digest: a requirement added since, such as a
# test tool, installs).
REQ_DIGEST="$(cat "$ROOT"/requirements/*.txt | cksum)"
if [ "${MMSOFT_FORCE_SETUP:-0}" != 1 ] && [ -f "$VENV/.mmsoft-setup-ok" ] \
   && [ "$(cat "$VENV/.mmsoft-setup-ok")" = "$REQ_DIGEST" ] \
   && "$PY" "$ROOT/tools/misc/check_env.py" --strict >/dev/null 2>&1; then
  say "$STACK environment in $VENV is complete (delete $VENV/.mmsoft-setup-ok to re-run the install)."
  exit 0
fi
rm -f "$VENV/.mmsoft-setup-ok"

say "installing torch $TORCH_VERSION, torchvision $TORCHVISION_VERSION and build tools"
# shellcheck disable=SC2086  # PINS holds requirement words
"${INSTALL[@]}" -q "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION" $PINS
"${INSTALL[@]}" -q "$SETUPTOOLS" wheel ninja packaging

# How to build mmcv's ops here: CPU only, or CUDA with an nvcc matching torch's CUDA, or
# stop now (before the long build) naming what to install. MMSOFT_MMCV_OPS=cpu opts into
# CPU-only ops on a GPU machine. See scripts/setup_plan.py.
PLAN="$("$PY" "$ROOT/scripts/setup_plan.py")" || { trap - ERR; exit 1; }
eval "$PLAN"
TAG="$("$PY" -c 'import sys, torch; v = torch.__version__.split("+")[0]; print("cp%d%d-torch%s" % (sys.version_info[0], sys.version_info[1], v))')"
[ "$MMCV_OPS" = cuda ] && TAG="$TAG-$MMCV_TAG"
WHEELDIR="$CACHE/$MMCV_DIST-$MMCV_VERSION-$TAG"
WHEEL_GLOB="${MMCV_DIST//-/_}-$MMCV_VERSION-*.whl"
if ! ls "$WHEELDIR"/$WHEEL_GLOB >/dev/null 2>&1; then
  say "building $MMCV_DIST $MMCV_VERSION with $MMCV_OPS ops for $TAG (minutes; docs/en/get_started.md gives its time)"
  BUILD="$(mktemp -d)"
  "${PIP[@]}" download -q --no-deps --no-binary :all: --no-build-isolation \
      "$MMCV_DIST==$MMCV_VERSION" -d "$BUILD" \
    || fail "could not download the $MMCV_DIST $MMCV_VERSION sdist from PyPI."
  tar -xzf "$BUILD/$MMCV_SDIST.tar.gz" -C "$BUILD"
  SRC="$BUILD/$MMCV_SDIST"
  # torch 2.14's headers need C++20; mmcv's setup.py hard-codes -std=c++14 / c++17.
  if [ -n "$CXX_STD" ]; then
    sed -i -e "s/-std=c++14/-std=$CXX_STD/g" -e "s/-std=c++17/-std=$CXX_STD/g" "$SRC/setup.py"
    grep -q "std=$CXX_STD" "$SRC/setup.py" || fail "mmcv setup.py patch did not apply."
  fi
  # Without debug information: -g0 after the -g of Python's own compile flags (CPPFLAGS
  # is appended to them by every setuptools; CFLAGS replaces them, -O3 included, in the
  # newer ones). The ops are the same machine code, each file compiles faster (timed:
  # docs/en/notes/changelog.md) and the wheel is smaller.
  # shellcheck disable=SC2086  # MMCV_BUILD_ENV holds NAME=value words for env
  (cd "$SRC" && env $MMCV_BUILD_ENV CPPFLAGS="${CPPFLAGS:+$CPPFLAGS }-g0" MMCV_WITH_OPS=1 \
     MAX_JOBS="${MAX_JOBS:-2}" "${PIP[@]}" wheel --no-build-isolation --no-deps -w "$BUILD/dist" .) \
    || fail "mmcv build failed; see the compiler output above."
  mkdir -p "$WHEELDIR"
  cp "$BUILD"/dist/$WHEEL_GLOB "$WHEELDIR"/
  rm -rf "$BUILD"
  say "cached the $MMCV_DIST wheel in $WHEELDIR"
else
  say "reusing the $MMCV_DIST $MMCV_VERSION wheel built earlier for $TAG ($WHEELDIR)"
fi
"${INSTALL[@]}" -q --no-deps "$WHEELDIR"/$WHEEL_GLOB

say "installing the $STACK mmengine, mmdet, mmsegmentation, mmpretrain, mim and test tools"
# mim's own requirements pull opendatalab/openxlab, which downgrade setuptools below what
# torch needs; mim train/test work without them. So mim comes last, with --no-deps, after
# the requirements it does use (requirements/mim.txt), resolved together with the rest,
# with PINS (what this stack pins among them) and torch kept at its version.
# shellcheck disable=SC2086  # PINS holds requirement words
"${INSTALL[@]}" -q -r "$REQUIREMENTS" -r "$ROOT/requirements/tests.txt" \
  -r "$ROOT/requirements/mim.txt" $PINS "torch==$TORCH_VERSION"
"${INSTALL[@]}" -q --no-deps "$MIM"

say "installing mmsoft in editable mode"
"${INSTALL[@]}" -q --no-deps --no-build-isolation -e "$ROOT"

# `pip check` names mim's missing opendatalab (left out on purpose, above); anything else
# it names is a real conflict, worth a warning (check_env.py below decides success).
MIM_NAME="${MIM%%==*}"
CONFLICTS="$("${PIP[@]}" check 2>&1 | grep -v -E -e "^No broken requirements found" \
  -e "^$MIM_NAME [^ ]+ requires opendatalab, which is not installed\.$" || true)"
[ -z "$CONFLICTS" ] || say "WARNING: pip check reports (mim's missing opendatalab aside):
$CONFLICTS"

"$PY" "$ROOT/tools/misc/check_env.py" --strict || fail "the environment check failed (see above)."
echo "$REQ_DIGEST" > "$VENV/.mmsoft-setup-ok"
say "done: activate with 'source $VENV/bin/activate'"
