"""Crafted checkpoints run nothing; legitimate ones load (mmsoft.checkpoint).

Every test runs against the installed mmengine: OpenMMLab's 0.10.7, or onedl-mmengine,
which retries a refused file with ``weights_only=False`` (the slow test at the end builds a
throwaway onedl-mmengine overlay of this venv and runs this file there). Payloads leave a
marker file when they run.
"""
import argparse
import builtins
import fractions
import functools
import http.server
import os
import os.path as osp
import pickle
import re
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest
import torch
from conftest import ROOT, data_path
from torch._tensor import _rebuild_from_type_v2

import mmsoft  # noqa: F401  (guards mmengine's checkpoint loading)
from mmsoft import checkpoint as mmsoft_checkpoint

ONEDL_MMENGINE = 'onedl-mmengine==0.10.12'


def _mmengine_stack():
    from mmengine.runner import checkpoint
    return 'onedl' if hasattr(checkpoint, '_safe_torch_load') else 'openmmlab'


# ---------------------------------------------------------------------------- payloads
class _Reduce:
    """Pickles as ``func(*args)``."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return (self.func, self.args)


def _attr(obj, *names):
    """``getattr(getattr(obj, a), b)...`` as the pickle spells it."""
    for name in names:
        obj = _Reduce(builtins.getattr, obj, name)
    return obj


def _touch_code(marker):
    return f"__import__('pathlib').Path({str(marker)!r}).touch() or 0"


def _call(func, result_type, *args):
    # torch allows _rebuild_from_type_v2 by default; it calls func(*args) for any func on
    # the unpickler's stack and returns the result when its type is result_type.
    return _Reduce(_rebuild_from_type_v2, func, result_type, args, None)


def os_system(marker):
    """The textbook payload: refused by torch whether or not mmsoft is imported, but run
    by onedl-mmengine's weights_only=False retry."""
    return _Reduce(os.system, f'touch {marker}')


def getattr_eval(marker):
    """Through an allow-listed builtins.getattr: getattr(getattr, '__self__') is the
    builtins module, whose eval torch's _rebuild_from_type_v2 then calls. Loads silently
    (returns 0) where builtins.getattr is allowed."""
    builtins_module = _attr(builtins.getattr, '__self__')
    return _call(_attr(builtins_module, 'eval'), _attr(builtins_module, 'int'),
                 _touch_code(marker))


def history_buffer_chain(marker):
    """Starts from HistoryBuffer, as a getattr restricted to HistoryBuffer as its first
    argument would still allow: HistoryBuffer.__init__.__globals__['__builtins__']['eval']."""
    from mmengine.logging import HistoryBuffer
    module_globals = _attr(HistoryBuffer, '__init__', '__globals__')
    builtins_dict = _call(_attr(module_globals, 'get'), _attr(module_globals, '__class__'),
                          '__builtins__')
    evaluate = _call(_attr(builtins_dict, 'get'), _attr(builtins.getattr, '__class__'),
                     'eval')
    return _call(evaluate, _attr(0, '__class__'), _touch_code(marker))


PAYLOADS = {'os_system': os_system, 'getattr_eval': getattr_eval,
            'history_buffer_chain': history_buffer_chain}


def _crafted(directory, payload, zipfile=True):
    marker = directory / f'ran_{payload}_{uuid.uuid4().hex[:6]}'
    path = directory / f'evil_{payload}_{"zip" if zipfile else "legacy"}_{marker.name}.pth'
    torch.save({'state_dict': {'linear.weight': torch.zeros(1, 2)},
                'meta': PAYLOADS[payload](marker)}, path,
               _use_new_zipfile_serialization=zipfile)
    return path, marker


# ---------------------------------------------------------------------- entry points
class _Toy:
    """A BaseModel (built lazily: mmengine is imported by the tests)."""

    @staticmethod
    def build():
        from mmengine.model import BaseModel

        class Toy(BaseModel):

            def __init__(self):
                super().__init__()
                self.linear = torch.nn.Linear(2, 1)

            def forward(self, inputs, data_samples=None, mode='tensor'):
                out = self.linear(inputs)
                return dict(loss=out.pow(2).mean()) if mode == 'loss' else out

        return Toy()


def _runner(work_dir, **kwargs):
    from mmengine.runner import Runner
    data = torch.utils.data.DataLoader([dict(inputs=torch.randn(2)) for _ in range(4)],
                                       batch_size=2)
    return Runner(model=_Toy.build(), work_dir=str(work_dir),
                  experiment_name=f'sec_{uuid.uuid4().hex[:8]}', train_dataloader=data,
                  optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
                  train_cfg=dict(by_epoch=False, max_iters=2, val_interval=1000),
                  default_hooks=dict(checkpoint=None, logger=None), **kwargs)


class _Server:
    """Serves a folder over http://127.0.0.1 (mmengine's load_from_http)."""

    def __init__(self, directory):
        class Quiet(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(
            ('127.0.0.1', 0), functools.partial(Quiet, directory=str(directory)))
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.directory = directory

    def url(self, path):
        return f'http://127.0.0.1:{self.httpd.server_port}/{osp.basename(path)}'


@pytest.fixture
def http_server(tmp_path, monkeypatch):
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch_home'))  # torch.hub's cache
    for var in ('http_proxy', 'HTTP_PROXY', 'all_proxy', 'ALL_PROXY'):
        monkeypatch.delenv(var, raising=False)
    server = _Server(tmp_path)
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()


def _load_via(entry, path, tmp_path, server=None):
    """Load ``path`` the way a user of mmsoft would, through ``entry``."""
    from mmengine.runner import CheckpointLoader, load_checkpoint
    if entry == 'init_cfg':
        from mmsoft.models import SOFT
        from conftest import SOFT_FIXTURE_ARCH
        SOFT(arch=SOFT_FIXTURE_ARCH,
             init_cfg=dict(type='Pretrained', checkpoint=str(path))).init_weights()
    elif entry == 'load_checkpoint':
        load_checkpoint(_Toy.build(), str(path))
    elif entry == 'CheckpointLoader':
        return CheckpointLoader.load_checkpoint(str(path))
    elif entry == 'CheckpointLoader_url':
        return CheckpointLoader.load_checkpoint(server.url(path))
    elif entry == 'load_from':
        _runner(tmp_path / 'wd', load_from=str(path)).load_or_resume()
    elif entry == 'resume':
        runner = _runner(tmp_path / 'wd', load_from=str(path), resume=True)
        runner.load_or_resume()
        return runner
    elif entry == 'mmsoft.checkpoint.load':
        return mmsoft_checkpoint.load(path)
    else:
        raise ValueError(entry)


ENTRIES = ['init_cfg', 'load_checkpoint', 'CheckpointLoader', 'CheckpointLoader_url',
           'load_from', 'resume', 'mmsoft.checkpoint.load']


# ------------------------------------------------------------------ crafted files
@pytest.mark.parametrize('zipfile', [True, False], ids=['zip', 'legacy'])
@pytest.mark.parametrize('payload', list(PAYLOADS))
@pytest.mark.parametrize('entry', ENTRIES)
def test_crafted_checkpoint_runs_nothing(entry, payload, zipfile, tmp_path, request):
    """Refused through every way mmsoft and mmengine load a checkpoint, with a message
    that says why and how to opt in; the payload never runs."""
    server = request.getfixturevalue('http_server') if entry.endswith('_url') else None
    path, marker = _crafted(tmp_path, payload, zipfile)
    try:
        _load_via(entry, path, tmp_path, server)
        err = None
    except Exception as e:  # noqa: B902  (what went wrong after a payload ran, too)
        err = e
    assert not marker.exists(), f'the {payload} payload ran through {entry}'
    assert err is not None, f'{entry} loaded the {payload} checkpoint'
    assert isinstance(err, mmsoft_checkpoint.UntrustedCheckpointError), err
    assert 'mmsoft refused to load checkpoint' in str(err)
    assert mmsoft_checkpoint.TRUSTED_ENV in str(err)
    assert 'mmsoft.checkpoint.trust(' in str(err)


@pytest.mark.parametrize('payload', ['getattr_eval', 'history_buffer_chain'])
def test_plain_torch_load_keeps_torchs_allow_list(payload, tmp_path):
    """``import mmsoft`` does not widen torch.load's allow-list for the rest of the
    process, before or after mmengine loaded a checkpoint."""
    from mmengine.runner import CheckpointLoader
    before = set(torch.serialization.get_safe_globals())
    CheckpointLoader.load_checkpoint(data_path('soft_public_checkpoint.pth'))
    assert set(torch.serialization.get_safe_globals()) == before
    path, marker = _crafted(tmp_path, payload)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path)
    assert not marker.exists()


@pytest.mark.parametrize('payload', ['getattr_eval', 'history_buffer_chain'])
def test_raw_getattr_allowed_by_others_is_withdrawn(payload, tmp_path):
    """onedl-mmengine wraps its first, weights_only=True attempt in
    torch.serialization.safe_globals([getattr, ...]); mmsoft's loading withdraws that
    getattr and puts back the caller's allow-list afterwards."""
    path, marker = _crafted(tmp_path, payload)
    with torch.serialization.safe_globals([builtins.getattr, slice]):
        inside = set(torch.serialization.get_safe_globals())
        with mmsoft_checkpoint.safe_globals():
            # which of two entries named builtins.getattr torch uses depends on set order
            during = torch.serialization.get_safe_globals()
            assert builtins.getattr not in during and slice in during
        with pytest.raises(mmsoft_checkpoint.UntrustedCheckpointError):
            mmsoft_checkpoint.load(path)
        assert set(torch.serialization.get_safe_globals()) == inside
    assert not marker.exists()


def test_history_buffer_statistics_table_is_not_replaced(tmp_path):
    """HistoryBuffer.__setstate__ writes the pickled ``statistics_methods`` into a table
    shared by the whole process; a checkpoint that changes it is refused and the table
    restored."""
    from mmengine.logging import HistoryBuffer
    from mmengine.runner import load_checkpoint
    table = dict(HistoryBuffer._statistics_methods)
    state = {'max_length': 10, '_log_history': np.zeros(1), '_count_history': np.ones(1),
             'statistics_methods': {'mean': argparse.Namespace, 'extra': argparse.Namespace}}
    path = tmp_path / 'table.pth'

    class Crafted:
        def __reduce__(self):
            return (HistoryBuffer, (), state)

    torch.save({'state_dict': {}, 'message_hub': {'log_scalars': {'loss': Crafted()}}}, path)
    try:
        with pytest.raises(pickle.UnpicklingError, match='statistics methods'):
            load_checkpoint(_Toy.build(), str(path))
        assert HistoryBuffer._statistics_methods == table
    finally:
        HistoryBuffer._statistics_methods.clear()
        HistoryBuffer._statistics_methods.update(table)


def test_guard_is_idempotent_and_keeps_the_rest_of_torch():
    from mmengine.runner import checkpoint
    mmsoft_checkpoint.guard_mmengine()
    mmsoft_checkpoint.guard_mmengine()
    assert checkpoint.torch.__dict__['_mmsoft_real_torch'] is torch
    assert checkpoint.torch.save is torch.save and checkpoint.torch.Tensor is torch.Tensor
    assert not hasattr(checkpoint.load_url.__wrapped__, '_mmsoft_guarded')


# ------------------------------------------------------------------ legitimate files
@pytest.fixture(scope='module')
def runner_checkpoint(tmp_path_factory):
    """A checkpoint saved by mmengine's Runner after two iterations: message hub with
    HistoryBuffers, numpy scalars in the runtime info and meta, optimizer state."""
    work_dir = tmp_path_factory.mktemp('runner')
    runner = _runner(work_dir)
    runner.train()
    runner.message_hub.update_info('best_score', np.float64(0.5))
    runner.save_checkpoint(str(work_dir), 'real.pth',
                           meta=dict(mmsoft_seed=np.int64(3), ratio=np.float32(0.25)))
    return work_dir / 'real.pth'


@pytest.fixture(scope='module')
def timm_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp('timm') / 'timm.pth'
    model = _Toy.build()
    torch.save({'model': model.state_dict(), 'epoch': 3,
                'args': argparse.Namespace(model='xcit_tiny', lr=5e-4, drop_path=0.1)},
               path)
    return path


def test_runner_checkpoint_loads(runner_checkpoint, tmp_path, http_server):
    from mmengine.logging import HistoryBuffer
    os.link(runner_checkpoint, tmp_path / 'real.pth')  # served by http_server
    for entry in ENTRIES[1:]:
        path = tmp_path / 'real.pth'
        loaded = _load_via(entry, path, tmp_path / entry, http_server)
        if entry == 'resume':
            assert loaded.iter == 2
        elif loaded is not None:
            assert loaded['meta']['iter'] == 2 and loaded['meta']['mmsoft_seed'] == 3
            assert isinstance(loaded['meta']['ratio'], np.float32)
            hub = loaded['message_hub']
            assert isinstance(hub['log_scalars']['train/loss'], HistoryBuffer)
            assert np.isfinite(hub['log_scalars']['train/loss'].mean())
            assert hub['runtime_info']['best_score'] == 0.5
            assert 'state' in loaded['optimizer']


def test_runner_checkpoint_loads_in_a_fresh_process(runner_checkpoint):
    """In a fresh process HistoryBuffer's statistics table is still empty and unpickling
    fills in its own four methods: that is not tampering (tools/test.py after training)."""
    code = ('import sys, mmsoft.checkpoint as c; from mmengine.logging import HistoryBuffer\n'
            'assert not HistoryBuffer._statistics_methods\n'
            'ck = c.load(sys.argv[1], map_location="cpu")\n'
            'print(ck["meta"]["iter"], sorted(HistoryBuffer._statistics_methods))')
    res = subprocess.run([sys.executable, '-c', code, str(runner_checkpoint)],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split()[-5:] == ['2', "['current',", "'max',", "'mean',", "'min']"]


def test_timm_checkpoint_loads(timm_checkpoint, tmp_path, http_server):
    os.link(timm_checkpoint, tmp_path / 'timm.pth')
    for entry in ['CheckpointLoader', 'CheckpointLoader_url', 'mmsoft.checkpoint.load']:
        loaded = _load_via(entry, tmp_path / 'timm.pth', tmp_path, http_server)
        assert loaded['args'].model == 'xcit_tiny' and 'linear.weight' in loaded['model']


@pytest.mark.parametrize('name', ['soft_public_checkpoint.pth', 'sima_public_checkpoint.pth',
                                  'soft_public_expected.pth', 'sima_public_expected.pth'])
def test_shipped_fixtures_load(name):
    from mmengine.runner import CheckpointLoader
    a = CheckpointLoader.load_checkpoint(data_path(name))
    b = mmsoft_checkpoint.load(data_path(name))
    assert a.keys() == b.keys() and len(a) > 0


# ------------------------------------------------------------------------ opt-in
def _benign_unlisted(tmp_path):
    """A checkpoint weights_only refuses although it is harmless (fractions.Fraction)."""
    path = tmp_path / 'fraction.pth'
    torch.save({'state_dict': {}, 'meta': {'ratio': fractions.Fraction(1, 3)}}, path)
    return path


@pytest.mark.parametrize('how', ['context', 'env'])
def test_trusted_file_loads_in_full(how, tmp_path, monkeypatch, http_server):
    from mmengine.runner import CheckpointLoader, load_checkpoint
    path = _benign_unlisted(tmp_path)
    url = http_server.url(path)
    with pytest.raises(mmsoft_checkpoint.UntrustedCheckpointError, match=re.escape(
            f'{mmsoft_checkpoint.TRUSTED_ENV}={osp.realpath(path)}')):
        CheckpointLoader.load_checkpoint(str(path))
    other, marker = _crafted(tmp_path, 'os_system')
    if how == 'env':
        monkeypatch.setenv(mmsoft_checkpoint.TRUSTED_ENV, os.pathsep.join([str(path), url]))
        trusted = mmsoft_checkpoint.trust(tmp_path / 'unrelated.pth')  # a no-op block
    else:
        trusted = mmsoft_checkpoint.trust(path, url)
    with trusted:
        for loaded in (CheckpointLoader.load_checkpoint(str(path)),
                       load_checkpoint(_Toy.build(), str(path)),
                       CheckpointLoader.load_checkpoint(url),
                       mmsoft_checkpoint.load(path)):
            assert loaded['meta']['ratio'] == fractions.Fraction(1, 3)
        with pytest.raises(mmsoft_checkpoint.UntrustedCheckpointError):  # not trusted
            CheckpointLoader.load_checkpoint(str(other))
    assert not marker.exists()
    if how == 'context':
        with pytest.raises(mmsoft_checkpoint.UntrustedCheckpointError):  # block left
            CheckpointLoader.load_checkpoint(str(path))


def test_trust_needs_paths():
    with pytest.raises(TypeError):
        with mmsoft_checkpoint.trust():
            pass


# ------------------------------------------------------------- onedl-mmengine overlay
def _pip_offline(output):
    return re.search(r'Could not find a version|No matching distribution|Max retries|'
                     r'Temporary failure in name resolution|Network is unreachable|'
                     r'Connection refused|ConnectionError|Failed to establish', output)


@pytest.mark.slow
def test_onedl_mmengine_overlay(tmp_path):
    """This file's tests, run in a throwaway venv where onedl-mmengine 0.10.12 (from PyPI)
    shadows the installed mmengine and everything else comes from this venv."""
    if _mmengine_stack() == 'onedl':
        pytest.skip('mmengine here already is onedl-mmengine: the tests above cover it')
    start = time.time()
    venv = tmp_path / 'onedl_venv'
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(venv)], check=True)
    python = str(venv / 'bin' / 'python')
    site_dir = subprocess.run(
        [python, '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
        check=True, capture_output=True, text=True).stdout.strip()
    import mmengine
    here = osp.dirname(osp.dirname(mmengine.__file__))  # this venv's site-packages
    with open(osp.join(site_dir, 'zz_mmsoft_base_venv.pth'), 'w') as f:
        f.write(here + '\n')
    pip = subprocess.run([sys.executable, '-m', 'pip', 'install', '--no-deps', '--target',
                          site_dir, ONEDL_MMENGINE], capture_output=True, text=True)
    if pip.returncode != 0:
        output = pip.stdout + pip.stderr
        if _pip_offline(output):
            pytest.skip(f'pip cannot get {ONEDL_MMENGINE} from PyPI: {output.strip()[-300:]}')
        raise AssertionError(f'pip install {ONEDL_MMENGINE} failed:\n{output[-3000:]}')
    env = dict(os.environ, PYTHONPATH=ROOT)
    check = subprocess.run(
        [python, '-c', 'import mmengine; from mmengine.runner import checkpoint; '
         'print(mmengine.__version__, mmengine.__file__, hasattr(checkpoint, "_safe_torch_load"))'],
        cwd=ROOT, env=env, capture_output=True, text=True)
    assert check.stdout.split()[0] == '0.10.12' and check.stdout.split()[2] == 'True', \
        check.stdout + check.stderr
    assert check.stdout.split()[1].startswith(site_dir), check.stdout
    setup_s = time.time() - start
    res = subprocess.run([python, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '-m',
                          'not slow', osp.abspath(__file__)], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    tail = (res.stdout + res.stderr)[-4000:]
    assert res.returncode == 0 and ' passed' in res.stdout and 'failed' not in res.stdout, tail
    print(f'onedl overlay: set up in {setup_s:.1f} s, tests in '
          f'{time.time() - start - setup_s:.1f} s; {res.stdout.strip().splitlines()[-1]}')
