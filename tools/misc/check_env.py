"""Check an environment for mmsoft: one line per component, and for each problem the fix.

    python tools/misc/check_env.py            # a clone;  `mim run mmsoft check_env` once installed
    python tools/misc/check_env.py --strict   # also fail on a missing optional codebase

Checks torch (and whether it sees a GPU), mmengine and mmcv (which distribution: the 2024
OpenMMLab releases or the OneDL continuation), whether mmcv's compiled ops run on the CPU
and, where torch sees a GPU, on CUDA; whether mmdet / mmseg / mmpretrain import (the
transformers >= 5 trap of mmpretrain 1.2 is named with its fix), and whether mmsoft imports
and `mim` finds its tools and model index. Exits 1 when something mmsoft needs is missing
or broken.
"""
import argparse
import os
import sys
from importlib import metadata

OK, WARN, FAIL = 'ok', 'warn', 'FAIL'


def dist_version(*names):
    """(distribution, version) of the first installed of ``names``, else (None, None)."""
    for name in names:
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None, None


def _load_compat():
    """mmsoft/compat.py (standard library only), loaded by path: it works where mmsoft's
    own imports (torch, mmengine) fail."""
    import importlib.util
    spec = importlib.util.find_spec('mmsoft')
    if spec is not None and spec.origin:
        path = os.path.join(os.path.dirname(spec.origin), 'compat.py')
    else:  # a clone that is not installed: mmsoft/ beside tools/
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        path = os.path.join(root, 'mmsoft', 'compat.py')
    if not os.path.isfile(path):
        return None
    compat_spec = importlib.util.spec_from_file_location('_mmsoft_compat', path)
    module = importlib.util.module_from_spec(compat_spec)
    compat_spec.loader.exec_module(module)
    return module


def _major(version):
    try:
        return int(version.split('.')[0])
    except (AttributeError, ValueError):
        return None


def check_torch():
    """torch's version and build, and the GPU it sees (status, description, fix)."""
    import torch
    gpu = torch.cuda.is_available()
    where = (f'GPU: {torch.cuda.get_device_name(0)}' if gpu else 'no GPU visible')
    build = f'CUDA {torch.version.cuda} build' if torch.version.cuda else 'CPU build'
    return OK, f'torch {torch.__version__} ({build}, {where})', None


def check_mmengine():
    """mmengine's version and distribution, failing unless it is a 0.x release (status,
    description, fix)."""
    import mmengine
    dist, _ = dist_version('mmengine', 'onedl-mmengine', 'mmengine-lite')
    if _major(mmengine.__version__) != 0:
        return FAIL, f'mmengine {mmengine.__version__}', 'pip install "mmengine>=0.10,<1.0"'
    return OK, f'mmengine {mmengine.__version__} ({dist or "source"})', None


def check_mmcv_ops():
    """Whether mmcv's compiled ops (nms, roi_align) run on the CPU and, where torch sees
    a GPU, on CUDA (status, description, fix)."""
    import mmcv
    import torch
    dist, _ = dist_version('mmcv', 'onedl-mmcv', 'mmcv-lite')
    name = f'mmcv {mmcv.__version__} ({dist or "source"})'
    try:
        from mmcv.ops import get_compiling_cuda_version, nms, roi_align
    except ImportError as e:
        return FAIL, f'{name}: compiled ops missing ({e})', (
            'mmcv-lite or an mmcv built without ops: run bash scripts/setup_env.sh, or build '
            'mmcv with MMCV_WITH_OPS=1')
    boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 11., 11.], [50., 50., 60., 60.]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    _, keep = nms(boxes, scores, iou_threshold=0.5)
    if keep.tolist() != [0, 2]:
        return FAIL, f'{name}: nms gave {keep.tolist()}', 'rebuild mmcv (scripts/setup_env.sh)'
    feat = torch.arange(16.).view(1, 1, 4, 4)
    out = roi_align(feat, torch.tensor([[0., 0., 0., 3., 3.]]), (2, 2), 1.0, 2, 'avg', True)
    if out.shape != (1, 1, 2, 2) or not torch.isfinite(out).all():
        return (FAIL, f'{name}: roi_align failed on the CPU',
                'rebuild mmcv (scripts/setup_env.sh)')
    cuda_ops = get_compiling_cuda_version()
    if cuda_ops in (None, 'not available'):
        if torch.cuda.is_available():
            return FAIL, f'{name}: ops run on the CPU, but were built without CUDA', (
                "mmdet's focal loss, NMS and RoIAlign will fail on the GPU: rebuild with a "
                'CUDA toolkit matching torch (delete .venv/.mmsoft-setup-ok and run bash '
                'scripts/setup_env.sh; it says what to install)')
        return OK, f'{name}: ops run on the CPU (built without CUDA)', None
    if torch.cuda.is_available():
        _, keep = nms(boxes.cuda(), scores.cuda(), iou_threshold=0.5)
        if keep.tolist() != [0, 2]:
            return FAIL, f'{name}: CUDA nms gave {keep.tolist()}', 'rebuild mmcv'
        return OK, f'{name}: ops run on the CPU and on CUDA (built with CUDA {cuda_ops})', None
    return OK, f'{name}: ops run on the CPU (built with CUDA {cuda_ops}; no GPU visible)', None


def check_codebase(module, dist_names, what, trap):
    """Whether ``module`` (mmdet, mmseg, mmpretrain: the first installed of ``dist_names``)
    imports its models; ``trap`` is the fix named when that fails with a TypeError
    (status, description, fix)."""
    dist, version = dist_version(*dist_names)
    if dist is None:
        return WARN, f'{module} not installed (needed for {what})', (
            f'pip install {dist_names[0]} (bash scripts/setup_env.sh installs the tested '
            'versions)')
    try:
        __import__(module + '.models')
    except TypeError as e:
        return FAIL, f'{module} {version}: import {module}.models failed ({e})', (
            trap or 'see the traceback of: python -c "import %s.models"' % module)
    except Exception as e:  # noqa: BLE001 - report any import failure in one line
        return FAIL, f'{module} {version}: import {module}.models failed ' \
                     f'({type(e).__name__}: {e})', f'python -c "import {module}.models"'
    return OK, f'{module} {version} ({dist})', None


def check_mmsoft():
    """mmsoft's version and the folder it is imported from (status, description, fix)."""
    import mmsoft
    return OK, f'mmsoft {mmsoft.__version__} ({os.path.dirname(mmsoft.__file__)})', None


def check_mim():
    """Where `mim train mmsoft` finds the tools and `mim search mmsoft` the model index:
    asked in a fresh interpreter outside the repository, as mim's console script runs (a
    clone's mmsoft.egg-info in the working directory would otherwise shadow the installed
    metadata)."""
    import subprocess
    code = 'from mim.utils import get_installed_path; print(get_installed_path("mmsoft"))'
    res = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         cwd=os.path.expanduser('~'))
    if res.returncode != 0 and 'No module named' in res.stderr and "'mim'" in res.stderr:
        return WARN, 'mim not installed (mim train/test mmsoft)', \
            'pip install openmim (or onedl-mim)'
    root = res.stdout.strip().splitlines()[-1] if res.returncode == 0 else ''

    def found(name, check=os.path.isfile):
        # openmim reads <package>/.mim/<name>; onedl-mim falls back to <root>/<name>
        # (editable install); the first that exists is used
        return [p for p in (os.path.join(root, '.mim', name), os.path.join(root, name))
                if root and check(p)]

    tools = found('tools', lambda t: os.path.isfile(os.path.join(t, 'train.py')))
    if not tools:
        return WARN, 'mim cannot find mmsoft\'s tools (mim train mmsoft ...)', (
            'install mmsoft: pip install -e . (in the repository)')
    index = found('model-index.yml')  # what `mim search mmsoft` reads
    if not index:
        return WARN, f'mim finds mmsoft\'s tools in {tools[0]} but no model-index.yml ' \
            '(mim search mmsoft)', 'reinstall mmsoft: pip install -e . (in the repository)'
    return OK, f'mim finds mmsoft\'s tools in {tools[0]} and its model index', None


def checks():
    """[(status, description, fix or None)] for this environment."""
    compat = _load_compat()
    trap = compat.transformers_trap() if compat else None
    steps = [('torch', check_torch), ('mmengine', check_mmengine), ('mmcv', check_mmcv_ops),
             ('mmdet', lambda: check_codebase('mmdet', ('mmdet', 'onedl-mmdetection'),
                                              'the detection configs', trap)),
             ('mmseg', lambda: check_codebase(
                 'mmseg', ('mmsegmentation', 'onedl-mmsegmentation'), 'the UperNet configs',
                 trap)),
             ('mmpretrain', lambda: check_codebase(
                 'mmpretrain', ('mmpretrain', 'onedl-mmpretrain'), 'the ImageNet configs',
                 trap)),
             ('mmsoft', check_mmsoft), ('mim', check_mim)]
    results = []
    for name, step in steps:
        try:
            results.append(step())
        except ImportError as e:
            results.append((FAIL, f'{name} cannot be imported ({e})',
                            'bash scripts/setup_env.sh makes a complete .venv'))
        except Exception as e:  # noqa: BLE001 - one line per broken component
            results.append((FAIL, f'{name}: {type(e).__name__}: {e}', None))
    if trap and not any(trap == fix for _, _, fix in results):
        results.append((WARN, 'transformers >= 5 beside mmpretrain <= 1.3', trap))
    return results


def build_parser():
    """The argument parser of this tool."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--strict', action='store_true',
                        help='fail on warnings too (a missing codebase or mim)')
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    results = checks()
    for status, what, fix in results:
        print(f'[{status:>4}] {what}' + (f'\n       fix: {fix}' if fix else ''))
    bad = [r for r in results if r[0] == FAIL or (args.strict and r[0] == WARN)]
    print('environment ok' if not bad else f'{len(bad)} problem(s) found', flush=True)
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
