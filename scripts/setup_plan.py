"""How scripts/setup_env.sh builds mmcv's compiled ops on this machine: CPU only, or with
CUDA against a toolkit that matches torch's CUDA, or not at all (stop before the long
build and say what to install).

Standalone (stdlib and torch only): it runs before anything else is installed.

    python scripts/setup_plan.py [--cpu-ops]    # prints shell assignments for setup_env.sh

mmcv's setup.py compiles CUDA ops whenever torch sees a GPU (or FORCE_CUDA=1) and then
needs nvcc of the same CUDA major version as torch; without one the build stops with a
compiler error after minutes. mmdet's detectors need those ops on the GPU (focal loss,
NMS, RoIAlign), so on a GPU machine the CPU-only build is an explicit opt-in
(``MMSOFT_MMCV_OPS=cpu``).
"""
import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys


class SetupStop(Exception):
    """The build cannot go on on this machine; the message says what to install."""


def nvcc_candidates(environ=os.environ):
    """nvcc executables in the order torch's extension builder looks: CUDA_HOME /
    CUDA_PATH, then PATH, then /usr/local/cuda."""
    seen = []
    for var in ('CUDA_HOME', 'CUDA_PATH'):
        if environ.get(var):
            seen.append(os.path.join(environ[var], 'bin', 'nvcc'))
    on_path = shutil.which('nvcc', path=environ.get('PATH'))
    if on_path:
        seen.append(on_path)
    seen.append('/usr/local/cuda/bin/nvcc')
    return [p for i, p in enumerate(seen) if p not in seen[:i]]


def nvcc_version(path):
    """'13.0' from ``nvcc --version`` ('Cuda compilation tools, release 13.0, V13.0.48'),
    or None when ``path`` does not run."""
    try:
        out = subprocess.run([path, '--version'], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r'release (\d+)\.(\d+)', out)
    return f'{m.group(1)}.{m.group(2)}' if m else None


def find_nvcc(environ=os.environ, version_of=nvcc_version):
    """[(path, version)] of the nvcc executables that run."""
    found = []
    for path in nvcc_candidates(environ):
        v = version_of(path)
        if v:
            found.append((path, v))
    return found


def plan(torch_cuda, gpu_visible, nvccs, cpu_ops=False):
    """Decide how to build mmcv's ops.

    Args:
        torch_cuda (str | None): ``torch.version.cuda`` ('13.0'; None for a CPU build).
        gpu_visible (bool): ``torch.cuda.is_available()``.
        nvccs (list[(str, str)]): nvcc executables found and their CUDA versions.
        cpu_ops (bool): the user opted into CPU-only ops on a GPU machine.
    Returns:
        dict: ``ops`` ('cpu' or 'cuda'), ``tag`` (wheel-cache suffix), ``env`` (variables
        for mmcv's build), ``warning`` (str or None).
    Raises:
        SetupStop: a GPU is visible, no matching nvcc was found and no opt-in was given.
    """
    if not gpu_visible:
        # mmcv's setup.py then builds CPU ops only; nothing to match.
        return dict(ops='cpu', tag='cpu', env=dict(FORCE_CUDA='0'), warning=None)
    if cpu_ops:
        return dict(
            ops='cpu', tag='cpu',
            # Hide the GPU from mmcv's setup.py, which builds CUDA ops whenever it sees one.
            env=dict(FORCE_CUDA='0', CUDA_VISIBLE_DEVICES=''),
            warning=('building mmcv ops WITHOUT CUDA (MMSOFT_MMCV_OPS=cpu) although torch '
                     'sees a GPU: mmsoft backbones run on the GPU, but mmdet parts that call '
                     "mmcv ops (RetinaNet/ATSS/GFL focal loss, NMS in every detector's test, "
                     'RoIAlign in Mask/Cascade/Sparse R-CNN) will fail on CUDA tensors.'))
    major = torch_cuda.split('.')[0] if torch_cuda else None
    if major is None:
        raise SetupStop('torch sees a GPU but reports no CUDA version (a ROCm build?); '
                        'set MMSOFT_MMCV_OPS=cpu to build CPU-only ops.')
    matching = [(p, v) for p, v in nvccs if v.split('.')[0] == major]
    if not matching:
        found = ', '.join(f'{p} (CUDA {v})' for p, v in nvccs) or 'none'
        raise SetupStop(
            f'torch was built with CUDA {torch_cuda} and sees a GPU, so '
            f"mmcv's CUDA ops must be compiled with nvcc from a CUDA {major}.x toolkit; "
            f'nvcc found: {found}. Install the CUDA {major}.x toolkit (e.g. the '
            f'cuda-toolkit-{major}-* packages, or conda install -c nvidia cuda-nvcc={major}.*) '
            'and point CUDA_HOME at it, then run this script again. Or set '
            "MMSOFT_MMCV_OPS=cpu to build CPU-only ops (mmdet's focal loss, NMS and "
            'RoIAlign will then fail on the GPU).')
    nvcc, version = matching[0]
    home = os.path.dirname(os.path.dirname(nvcc))
    return dict(ops='cuda', tag=f'cu{torch_cuda.replace(".", "")}',
                env=dict(FORCE_CUDA='1', CUDA_HOME=home), warning=None,
                nvcc=nvcc, nvcc_version=version)


def main(argv=None):
    """Print ``NAME=value`` lines (shell-quoted) for ``eval`` in setup_env.sh; on a stop,
    print why to stderr and exit 2."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--cpu-ops', action='store_true',
                        help='build CPU-only ops even if torch sees a GPU '
                        '(same as MMSOFT_MMCV_OPS=cpu)')
    args = parser.parse_args(argv)
    import torch
    try:
        p = plan(torch.version.cuda, torch.cuda.is_available(), find_nvcc(),
                 args.cpu_ops or os.environ.get('MMSOFT_MMCV_OPS') == 'cpu')
    except SetupStop as e:
        print(f'[setup_env] ERROR: {e}', file=sys.stderr)
        return 2
    env = ' '.join(f'{k}={v}' for k, v in p['env'].items())
    print(f'MMCV_OPS={p["ops"]}')
    print(f'MMCV_TAG={p["tag"]}')
    print(f'MMCV_BUILD_ENV={shlex.quote(env)}')
    if p['warning']:
        print(f'[setup_env] WARNING: {p["warning"]}', file=sys.stderr)
    return 0


if __name__ == '__main__':
    sys.exit(main())
