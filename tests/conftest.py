import importlib.util
import os
import os.path as osp
import re
import subprocess
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
# the backbones against the official outputs): marked ``numerics``. The whole suite runs
# them on one thread per test process with SIMD kernels, and CI a second time in one
# process on two threads without them (OMP_NUM_THREADS=2, ATEN_CPU_CAPABILITY=default), so
# that a tolerance resting on one machine's order of sums fails there, not on a user's
# machine.
NUMERICS_MODULES = ('test_attention.py', 'test_plan.py', 'test_soft.py', 'test_fidelity.py',
                    'test_xcit_sima.py', 'test_fixtures.py')


# The tests that go through the OpenMMLab packages' own machinery (registry, configs, the
# runner, checkpoint loading through mmengine's initializers, the tools, the set-up):
# marked ``openmmlab``. The OneDL stack differs from the default one in those packages
# only (the same torch), so CI runs these there; the attention math, the fidelity floor
# and the backbones' sizes and precisions run once per torch, the docs' checks and the
# tools that time or report mmsoft's torch code once (docs/en/notes/tests.md, "CI"). A
# test elsewhere that builds a model through mmdet or mmseg carries the marker itself.
OPENMMLAB_DIRS = ('apis', 'checkpoint', 'configs', 'e2e', 'scripts', 'tools')
OPENMMLAB_MODULES = ('test_registry.py', 'test_soft.py', 'test_xcit_sima.py',
                     'test_contract.py')
NOT_OPENMMLAB_MODULES = ('test_benchmark.py', 'test_benchmark_tables.py',
                         'test_device_report.py')


def _goes_through_openmmlab(path):
    if path.name in OPENMMLAB_MODULES:
        return True
    folder = osp.relpath(path, osp.join(ROOT, 'tests')).split(os.sep)[0]
    return folder in OPENMMLAB_DIRS and path.name not in NOT_OPENMMLAB_MODULES


def _memoized(module, name, key=lambda *args, **kwargs: args if not kwargs else None):
    """``module.name`` replaced by a memo of its results for the calls ``key`` names
    (None: not memoized)."""
    original = getattr(module, name, None)
    if original is None or hasattr(original, 'results'):
        return
    results = {}

    def memo(*args, **kwargs):
        k = key(*args, **kwargs)
        if k is None:
            return original(*args, **kwargs)
        if k not in results:
            results[k] = original(*args, **kwargs)
        return results[k]

    memo.results = results
    setattr(module, name, memo)


def _read_installed_packages_once():
    """Reading a config, mmengine asks whether each package a base config names is
    installed (re-importing pkg_resources each time: 35 ms) and resolves an experiment
    config of another package (``mmdet::atss/atss_r50_fpn_1x_coco.py``) by parsing every
    metafile that package lists (about 400 YAML files for mmdet: 0.3 s) at each such
    name. The suite reads the shipped configs hundreds of times: within a run each answer
    and each file is read once (the installed packages do not change while the tests run,
    and mmengine only reads the parsed files)."""
    try:
        from mmengine.config import config, utils
    except ImportError:
        return
    _memoized(config, 'is_installed')
    _memoized(utils, 'load', lambda file, *args, **kwargs: file if (
        not args and not kwargs and isinstance(file, str) and file.endswith('.yml')) else None)


def _one_thread_per_worker():
    """In a run with several test processes (pytest-xdist's workers: scripts/run_tests.sh
    starts one per CPU core), each process and those its tests start compute on one
    thread, unless OMP_NUM_THREADS says otherwise: two processes of two threads each on
    two cores wait for each other's threads (torch's runs took up to 20x longer so)."""
    if int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '1')) < 2:
        return
    if 'OMP_NUM_THREADS' not in os.environ:
        os.environ['OMP_NUM_THREADS'] = '1'
        os.environ.setdefault('MKL_NUM_THREADS', '1')
    torch.set_num_threads(int(os.environ['OMP_NUM_THREADS']))


def pytest_configure(config):
    _read_installed_packages_once()
    _one_thread_per_worker()
    config.addinivalue_line('markers', 'slow: end-to-end tests that train a model, and '
                            'tests that take a minute or more')
    config.addinivalue_line('markers', 'openmmlab: goes through the OpenMMLab packages '
                            '(what CI runs again on the OneDL stack)')
    config.addinivalue_line('markers', 'cuda: needs a CUDA GPU (skipped without one)')
    config.addinivalue_line('markers', 'numerics: compares floats from different paths '
                            '(run again in another numeric configuration by CI)')


# The modules that take longest (a few minutes each in the whole suite: the end-to-end
# runs, the fidelity sweep, the large inputs), first: the workers of a parallel run
# (scripts/run_tests.sh) take a module at a time in this order, and a long module taken
# last would leave one worker running alone at the end.
LONGEST_FIRST = ('tests/e2e/test_pipelines.py', 'tests/models/backbones/test_fidelity.py',
                 'tests/models/backbones/test_robustness.py', 'tests/tools/test_benchmark.py',
                 'tests/configs/test_configs.py', 'tests/e2e/test_distributed.py',
                 'tests/models/backbones/test_soft.py', 'tests/tools/test_environment.py',
                 'tests/tools/test_train_test_tools.py',
                 'tests/checkpoint/test_checkpoint_security.py')


def _longest_first(item):
    module = osp.relpath(item.path, ROOT).replace(os.sep, '/')
    return LONGEST_FIRST.index(module) if module in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in NUMERICS_MODULES:
            item.add_marker(pytest.mark.numerics)
        if _goes_through_openmmlab(item.path):
            item.add_marker(pytest.mark.openmmlab)
    items.sort(key=_longest_first)  # stable: each module's tests keep their order


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
    import uuid

    from mmengine.logging import MMLogger
    kept = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = lambda record: kept.append(keep(record))
    # a current logger of the test's own, as a new process has: a Runner made by an
    # earlier test in this process leaves its logger current, with a file handler that
    # mmengine writes some records to instead (the init log of init_weights())
    logger = MMLogger.get_instance(f'mmsoft-test-{uuid.uuid4().hex}')
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
