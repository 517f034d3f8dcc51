import importlib.util
import json
import os
import os.path as osp
import re
import subprocess
import sys
from contextlib import ExitStack, contextmanager

import pytest
import torch

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))  # the repository
DATA = osp.join(ROOT, 'tests', 'data')

# torch 2.1's Dynamo cannot trace mmsoft's autograd Functions into one graph: torch.compile
# breaks the graph there and runs them eagerly. The one-graph tests need a newer torch.
TORCH_VERSION = tuple(int(v) for v in re.findall(r'\d+', torch.__version__)[:2])
needs_one_graph_dynamo = pytest.mark.skipif(
    TORCH_VERSION < (2, 2), reason=f"torch {torch.__version__}'s Dynamo cannot trace "
    "mmsoft's autograd Functions into one graph")


def cpu_autocast_supports(dtype):
    """Whether this torch's CPU autocast takes ``dtype`` (torch 2.1: bfloat16 only)."""
    try:
        with torch.autocast('cpu', dtype=dtype):
            return True
    except RuntimeError:
        return False


def data_path(name):
    return osp.join(DATA, name)


def rel_err(a, b):
    """max|a - b| / max|b|: the parity fixtures' relative error (tests/data/README.md)."""
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


def run(cmd, cwd, env=None):
    """Run a command as a user would; on failure show the tail of its output."""
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True,
                         env=dict(os.environ, **(env or {})))
    if res.returncode != 0:
        raise AssertionError(f'{" ".join(map(str, cmd))} failed:\n{res.stdout[-4000:]}\n'
                             f'{res.stderr[-4000:]}')
    return res.stdout + res.stderr


def run_interpreted(script):
    """The JSON object a checks script prints last, run in Triton's interpreter: in a
    process of its own, since Triton decides when it is imported (TRITON_INTERPRET=1)."""
    out = run([sys.executable, script], cwd=ROOT, env=dict(TRITON_INTERPRET='1'))
    return json.loads(out.strip().splitlines()[-1])


def load_tool(path):
    """A script under tools/ (``path`` relative to the repository) as a module, loaded
    from its file as ``python tools/...`` runs it, without touching ``sys.path``."""
    name = osp.splitext(osp.basename(path))[0]
    spec = importlib.util.spec_from_file_location(f'mmsoft_tool_{name}', osp.join(ROOT, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def untrained_checkpoint(cfg_path, path):
    """The config's model after init_weights(), saved as an mmengine checkpoint."""
    from mmsoft.apis import init_model
    model = init_model(cfg_path)
    torch.save({'state_dict': model.state_dict(), 'meta': {}}, path)
    return str(path)


def halvings(A, alpha):
    """How often ``newton_alpha`` halved 2 / (max row sum)² for A (an integer tensor)."""
    start = 2 / A.abs().sum(-1).amax(-1).pow(2)[..., None, None]
    return torch.round(torch.log2(start / alpha)).long()


def alpha_tie(m=96, d=16, seed=0):
    """Landmarks (m, d), float64, on either side of a tie in ``newton_alpha``'s choice:
    their float32 Gaussian kernels, one bandwidth step apart (bisection), take different
    numbers of halvings when the choice is computed in float64 and differ in a few
    entries by one unit in the last place."""
    from mmsoft.models.attention import gaussian_kernel, newton_alpha
    x = torch.randn(m, d, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))

    def decided(t):  # halvings decided in float64 for the float32 kernel
        A = gaussian_kernel(x * t, x * t).float().double()
        return halvings(A, newton_alpha(A)).item()

    lo, hi = 0.05, 1.0
    assert decided(lo) != decided(hi)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if decided(mid) == decided(lo) else (lo, mid)
    return x * lo, x * hi


@pytest.fixture
def force_plan():
    """``force_plan(**choices)``: ``attention_plan(**choices)`` until the test ends
    (calls nest)."""
    from mmsoft.models.attention import attention_plan
    with ExitStack() as stack:
        yield lambda *args, **kwargs: stack.enter_context(attention_plan(*args, **kwargs))


@pytest.fixture
def no_tf32():
    """TF32 off for convolutions and matmuls until the test ends (the CUDA tests:
    PyTorch runs convolutions in TF32 by default on Ampere and later GPUs)."""
    conv, mm = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.fp32_precision
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.fp32_precision = 'ieee'
    yield
    torch.backends.cudnn.allow_tf32 = conv
    torch.backends.cuda.matmul.fp32_precision = mm


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


# Modules whose tests compare floats computed along different paths (the attention math,
# the backbones against the official outputs): marked ``numerics``, and CI runs them a
# second time with one thread and no SIMD kernels (OMP_NUM_THREADS=1,
# ATEN_CPU_CAPABILITY=default), so that a tolerance resting on one machine's order of
# sums fails there, not on a user's machine.
NUMERICS_MODULES = ('test_attention.py', 'test_plan.py', 'test_soft.py', 'test_fidelity.py',
                    'test_xcit_sima.py', 'test_fixtures.py')


# The tests that go through the OpenMMLab packages' own machinery (registry, configs, the
# runner, checkpoint loading through mmengine's initializers, the tools, the set-up):
# marked ``openmmlab``. The OneDL stack differs from the default one in those packages
# only (the same torch), so CI runs these there; the attention math, the fidelity floor,
# the backbones' sizes and precisions, the docs' checks and the tools that time or report
# mmsoft's torch code run once per torch. A test elsewhere that builds a model through
# mmdet or mmseg carries the marker itself.
OPENMMLAB_DIRS = ('apis', 'checkpoint', 'configs', 'e2e', 'scripts', 'tools')
OPENMMLAB_MODULES = ('test_registry.py', 'test_soft.py', 'test_xcit_sima.py')
NOT_OPENMMLAB_MODULES = ('test_benchmark.py', 'test_benchmark_tables.py',
                         'test_device_report.py')


def _goes_through_openmmlab(path):
    if path.name in OPENMMLAB_MODULES:
        return True
    folder = osp.relpath(path, osp.join(ROOT, 'tests')).split(os.sep)[0]
    return folder in OPENMMLAB_DIRS and path.name not in NOT_OPENMMLAB_MODULES


def pytest_configure(config):
    config.addinivalue_line('markers', 'slow: end-to-end tests that train a model, and '
                            'tests that take a minute or more')
    config.addinivalue_line('markers', 'openmmlab: goes through the OpenMMLab packages '
                            '(what CI runs again on the OneDL stack)')
    config.addinivalue_line('markers', 'cuda: needs a CUDA GPU (skipped without one)')
    config.addinivalue_line('markers', 'numerics: compares floats from different paths '
                            '(run again in another numeric configuration by CI)')


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in NUMERICS_MODULES:
            item.add_marker(pytest.mark.numerics)
        if _goes_through_openmmlab(item.path):
            item.add_marker(pytest.mark.openmmlab)


# The tiny archs of the parity fixtures (tests/data/README.md, tests/data/*_public_*.pth).
SOFT_FIXTURE_ARCH = dict(embed_dims=[32, 64, 96, 128], num_heads=[1, 2, 3, 4],
                         depths=[1, 1, 2, 1])
SIMA_FIXTURE_ARCH = dict(embed_dims=64, depth=4, num_heads=2, eta=1.0)


def fixture_model(**kwargs):
    """The SOFT parity fixture's model (official-format tiny checkpoint), in eval mode."""
    from mmsoft.models import SOFT
    kwargs.setdefault('init_cfg', dict(type='Pretrained',
                                       checkpoint=data_path('soft_public_checkpoint.pth')))
    model = SOFT(arch=SOFT_FIXTURE_ARCH, drop_path_rate=0., **kwargs)
    model.init_weights()
    return model.eval()


@contextmanager
def _mmengine_collected(keep):
    """(logger, kept): ``keep(record)`` of every record mmengine's current logger hands its
    handlers while the block runs (its stream handler prints these at INFO and above;
    mmengine's logger does not propagate to the root logger, so pytest's caplog misses
    them)."""
    import logging

    from mmengine.logging import MMLogger
    kept = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = lambda record: kept.append(keep(record))
    logger = MMLogger.get_current_instance()
    logger.addHandler(handler)
    try:
        yield logger, kept
    finally:
        logger.removeHandler(handler)


@pytest.fixture
def mmengine_log():
    """The messages logged through mmengine's current logger during the test."""
    with _mmengine_collected(lambda record: record.getMessage()) as (_, messages):
        yield messages


@pytest.fixture
def mmengine_records():
    """(logger, records): mmengine's current logger and the records it logged during the
    test (levels included)."""
    with _mmengine_collected(lambda record: record) as collected:
        yield collected
