"""Crafted checkpoints run nothing; legitimate ones load (mmsoft.checkpoint).

Every test runs against the installed mmengine: OpenMMLab's 0.10.7, or onedl-mmengine,
which retries a refused file with ``weights_only=False`` (CI runs this file on the OneDL
stack: ``MMSOFT_STACK=onedl``). Payloads leave a marker file when they run.
"""
import argparse
import builtins
import fractions
import functools
import http.server
import json
import os
import os.path as osp
import pickle
import re
import shutil
import subprocess
import sys
import threading
import types
import uuid

import numpy as np
import pytest
import torch
from conftest import ROOT, data_path
from torch._tensor import _rebuild_from_type_v2

import mmsoft  # noqa: F401  (guards mmengine's checkpoint loading)
from mmsoft import checkpoint as mmsoft_checkpoint

# Tests of torch's own allow-list (torch >= 2.5), which mmsoft scopes; with older torch
# mmsoft reads with its restricted unpickler instead and refuses the same files (every
# other test here runs on every torch).
needs_allow_list = pytest.mark.skipif(
    not mmsoft_checkpoint.ALLOW_LIST,
    reason=f'torch {torch.__version__} has no weights_only allow-list (torch >= 2.5)')


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
                  # as the detection configs: its state keeps the milestones in a Counter
                  param_scheduler=dict(type='MultiStepLR', by_epoch=False, milestones=[1]),
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


def _serve_as_open_mmlab(name, location, tmp_path, monkeypatch):
    """Name ``location`` (a URL, or a path relative to mmengine's cache folder)
    ``open-mmlab://NAME`` through ``$MMENGINE_HOME/open_mmlab.json``, as a user would."""
    home = tmp_path / 'mmengine_home'
    home.mkdir(exist_ok=True)
    monkeypatch.setenv('MMENGINE_HOME', str(home))
    (home / 'open_mmlab.json').write_text(json.dumps({name: location}))
    return home


def _fake_pavi(path):
    """A ``pavi`` package whose modelcloud hands out ``path`` for any model name."""
    model = types.SimpleNamespace(name=osp.basename(path),
                                  download=lambda target: shutil.copy(path, target))
    return types.SimpleNamespace(modelcloud=types.SimpleNamespace(get=lambda name: model))


def _load_via(entry, path, tmp_path, server=None, monkeypatch=None):
    """Load ``path`` the way a user of mmsoft would, through ``entry``."""
    from mmengine.runner import CheckpointLoader, load_checkpoint
    from mmengine.runner import checkpoint as mmengine_checkpoint
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
    elif entry == 'open-mmlab_url':
        _serve_as_open_mmlab('mmsoft_test', server.url(path), tmp_path, monkeypatch)
        return CheckpointLoader.load_checkpoint('open-mmlab://mmsoft_test')
    elif entry == 'openmmlab_local':
        home = tmp_path / 'mmengine_home'
        _serve_as_open_mmlab('mmsoft_test', osp.relpath(path, home), tmp_path, monkeypatch)
        return CheckpointLoader.load_checkpoint('openmmlab://mmsoft_test')
    elif entry == 'torchvision_url':
        monkeypatch.setattr(mmengine_checkpoint, 'get_torchvision_models',
                            lambda: {'mmsoft_test': server.url(path)})
        return CheckpointLoader.load_checkpoint('torchvision://mmsoft_test')
    elif entry == 'mmcls_url':
        monkeypatch.setattr(mmengine_checkpoint, 'get_mmcls_models',
                            lambda: {'mmsoft_test': server.url(path)})
        return CheckpointLoader.load_checkpoint('mmcls://mmsoft_test')
    elif entry == 'pavi':
        monkeypatch.setitem(sys.modules, 'pavi', _fake_pavi(path))
        return CheckpointLoader.load_checkpoint(f'pavi://mmsoft/{osp.basename(path)}')
    elif entry == 's3':
        import mmengine.fileio
        monkeypatch.setattr(mmengine.fileio, 'get_file_backend', lambda uri, backend_args=None:
                            types.SimpleNamespace(get=lambda uri: path.read_bytes()))
        return CheckpointLoader.load_checkpoint(f's3://mmsoft/{osp.basename(path)}')
    elif entry == 'mmengine.load_from_local':  # mmengine's loader function, called by name
        return mmengine_checkpoint.load_from_local(str(path), None)
    elif entry == 'mmengine.load_from_http':
        return mmengine_checkpoint.load_from_http(server.url(path))
    else:
        raise ValueError(entry)


ENTRIES = ['init_cfg', 'load_checkpoint', 'CheckpointLoader', 'CheckpointLoader_url',
           'load_from', 'resume', 'mmsoft.checkpoint.load']
# the other schemes of mmengine's CheckpointLoader; pavi's modelcloud, the s3 backend and
# the name tables of torchvision:// and mmcls:// are stand-ins that serve the test's file
SCHEME_ENTRIES = ['open-mmlab_url', 'openmmlab_local', 'torchvision_url', 'mmcls_url', 'pavi',
                  's3']
# mmengine's loader functions called by name, past CheckpointLoader (mmsoft's guard of
# mmengine.runner.checkpoint's torch.load and load_url)
DIRECT_ENTRIES = ['mmengine.load_from_local', 'mmengine.load_from_http']


# ------------------------------------------------------------------ crafted files
@pytest.mark.parametrize('zipfile', [True, False], ids=['zip', 'legacy'])
@pytest.mark.parametrize('payload', list(PAYLOADS))
@pytest.mark.parametrize('entry', ENTRIES + SCHEME_ENTRIES + DIRECT_ENTRIES)
def test_crafted_checkpoint_runs_nothing(entry, payload, zipfile, tmp_path, request,
                                         monkeypatch):
    """Refused through every way mmsoft and mmengine load a checkpoint, with a message
    that says why and how to opt in; the payload never runs."""
    server = request.getfixturevalue('http_server') if entry.endswith(
        ('_url', '_http')) else None
    path, marker = _crafted(tmp_path, payload, zipfile)
    try:
        _load_via(entry, path, tmp_path, server, monkeypatch)
        err = None
    except Exception as e:  # noqa: B902  (what went wrong after a payload ran, too)
        err = e
    assert not marker.exists(), f'the {payload} payload ran through {entry}'
    assert err is not None, f'{entry} loaded the {payload} checkpoint'
    assert isinstance(err, mmsoft_checkpoint.UntrustedCheckpointError), err
    assert 'mmsoft refused to load checkpoint' in str(err)
    assert mmsoft_checkpoint.TRUSTED_ENV in str(err)
    assert 'mmsoft.checkpoint.trust(' in str(err)
    assert err.reason and err.reason in str(err), 'what weights_only refused'


def _fell_back(mmengine_log, capsys):
    """Whether onedl-mmengine said it retries with weights_only=False (it prints the
    message: print_log without a logger)."""
    return any('Falling back to weights_only=False' in m
               for m in mmengine_log + [capsys.readouterr().out])


def test_schemes_read_without_onedl_retry(tmp_path, mmengine_log, capsys):
    """Through CheckpointLoader a refused file is refused at once: onedl-mmengine's reader
    (and its weights_only=False retry) is not what reads it."""
    from mmengine.runner import CheckpointLoader
    path, marker = _crafted(tmp_path, 'os_system')
    with pytest.raises(mmsoft_checkpoint.UntrustedCheckpointError) as info:
        CheckpointLoader.load_checkpoint(str(path))
    assert not _fell_back(mmengine_log, capsys)
    assert 'asked torch to unpickle it with weights_only=False' not in str(info.value)
    assert info.value.source == str(path) and not marker.exists()


def test_every_scheme_of_mmengine_is_mmsofts():
    """Each prefix of CheckpointLoader's table (read, not changed) is served by mmsoft's
    loader: a scheme mmengine adds later fails here instead of loading unguarded."""
    from mmengine.runner import CheckpointLoader

    from mmsoft.checkpoint import guard
    ours = {prefix: loader for prefixes, loader in guard.SCHEMES
            for prefix in ([prefixes] if isinstance(prefixes, str) else prefixes)}
    table = dict(CheckpointLoader._schemes)
    assert set(ours) <= set(table)
    for prefix, loader in table.items():
        assert loader is ours.get(prefix), (prefix, loader)


def test_onedl_retry_by_name_is_refused_with_the_first_reason(tmp_path, mmengine_log,
                                                             capsys):
    """mmengine's load_from_local called by name: onedl-mmengine retries the refused file
    with weights_only=False inside its ``except``; the refusal of that retry says what
    weights_only refused the first time (carried by the handled exception)."""
    from mmengine.runner import checkpoint as mmengine_checkpoint
    path, marker = _crafted(tmp_path, 'os_system')
    with pytest.raises(mmsoft_checkpoint.UntrustedCheckpointError) as info:
        mmengine_checkpoint.load_from_local(str(path), None)
    assert not marker.exists()
    err = info.value
    assert err.source == str(path) and 'system' in err.reason and err.reason in str(err)
    retried = _fell_back(mmengine_log, capsys)
    assert retried == (_mmengine_stack() == 'onedl')
    assert ('asked torch to unpickle it with weights_only=False' in str(err)) == retried


@pytest.mark.parametrize('payload', ['getattr_eval', 'history_buffer_chain'])
@needs_allow_list
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
@needs_allow_list
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
    restored. Checked in a fresh process, through HistoryBuffer's public statistics."""
    from mmengine.logging import HistoryBuffer
    state = {'max_length': 10, '_log_history': np.zeros(1), '_count_history': np.ones(1),
             'statistics_methods': {'mean': argparse.Namespace, 'extra': argparse.Namespace}}
    path = tmp_path / 'table.pth'

    class Crafted:
        def __reduce__(self):
            return (HistoryBuffer, (), state)

    torch.save({'state_dict': {}, 'message_hub': {'log_scalars': {'loss': Crafted()}}}, path)
    code = ('import pickle, sys, mmsoft\n'
            'from mmengine.logging import HistoryBuffer\n'
            'from mmengine.runner import CheckpointLoader\n'
            'HistoryBuffer()  # the table as a training process has it\n'
            'try:\n'
            '    CheckpointLoader.load_checkpoint(sys.argv[1])\n'
            'except pickle.UnpicklingError as err:\n'
            '    print("refused", "statistics methods" in str(err))\n'
            'buffer = HistoryBuffer([1.0, 2.0], [1, 1])\n'
            'print("mean", buffer.statistics("mean"))\n'
            'try:\n'
            '    buffer.statistics("extra")\n'
            'except KeyError:\n'
            '    print("extra absent")\n')
    res = subprocess.run([sys.executable, '-c', code, str(path)], capture_output=True,
                         text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.splitlines()[-3:] == ['refused True', 'mean 1.5', 'extra absent'], \
        res.stdout + res.stderr[-2000:]


@needs_allow_list
def test_mmengine_module_adds_nothing_to_torchs_allow_list():
    """onedl-mmengine wraps its reads in torch.serialization.safe_globals([getattr, ...]),
    which is process-wide: a crafted file read at the same time in another thread would
    get builtins.getattr. Inside mmengine's checkpoint module that block adds nothing
    (its torch.load is mmsoft's, with mmsoft's allow-list)."""
    from mmengine.runner import checkpoint
    before = set(torch.serialization.get_safe_globals())
    with checkpoint.torch.serialization.safe_globals([builtins.getattr, slice]):
        assert set(torch.serialization.get_safe_globals()) == before
    assert checkpoint.torch.serialization.get_safe_globals is \
        torch.serialization.get_safe_globals


def test_guard_is_idempotent_and_keeps_the_rest_of_torch():
    from mmengine.runner import checkpoint
    load_url = checkpoint.load_url
    mmsoft_checkpoint.guard_mmengine()
    mmsoft_checkpoint.guard_mmengine()
    assert checkpoint.load_url is load_url  # wrapped once
    assert checkpoint.load_url.__wrapped__ is torch.hub.load_state_dict_from_url
    assert checkpoint.torch.load is not torch.load
    assert checkpoint.torch.save is torch.save and checkpoint.torch.Tensor is torch.Tensor
    assert checkpoint.torch.distributed is torch.distributed


# ------------------------------------------------------------------ legitimate files
@pytest.fixture(scope='module')
def runner_checkpoint(tmp_path_factory):
    """A checkpoint saved by mmengine's Runner after two iterations: message hub with
    HistoryBuffers, numpy scalars in the runtime info and meta, optimizer state, a
    MultiStepLR scheduler's state (its milestones a collections.Counter)."""
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


def test_runner_checkpoint_loads(runner_checkpoint, tmp_path, http_server, monkeypatch):
    from mmengine.logging import HistoryBuffer
    os.link(runner_checkpoint, tmp_path / 'real.pth')  # served by http_server
    entries = ENTRIES[1:] + [e for e in SCHEME_ENTRIES + DIRECT_ENTRIES if e != 'mmcls_url']
    for entry in entries:
        path = tmp_path / 'real.pth'
        (tmp_path / entry).mkdir()
        loaded = _load_via(entry, path, tmp_path / entry, http_server, monkeypatch)
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
            assert dict(loaded['param_schedulers'][0]['milestones']) == {1: 1}


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


def test_restricted_unpickler_where_torch_has_no_allow_list(runner_checkpoint, timm_checkpoint,
                                                           tmp_path):
    """torch < 2.5 (no weights_only allow-list: ALLOW_LIST False, forced here in a fresh
    process on any torch): mmsoft's restricted unpickler reads mmengine's and timm's
    checkpoints without a warning or a trust grant and refuses crafted files with the
    same error as on newer torch; a harmless file outside the list names its global and
    loads once trusted."""
    crafted = [str(_crafted(tmp_path, payload, zipfile)[0])
               for payload in PAYLOADS for zipfile in (True, False)]
    code = ('import sys, warnings, mmsoft.checkpoint as c\n'
            'from mmsoft.checkpoint import safe_load\n'
            'safe_load.ALLOW_LIST = False\n'
            'assert c.protection(True)["pickle_module"].__name__.endswith("restricted_pickle")\n'
            'with warnings.catch_warnings(record=True) as seen:\n'
            '    warnings.simplefilter("always")\n'
            '    runner = c.load(sys.argv[1], map_location="cpu")\n'
            '    timm = c.load(sys.argv[2], map_location="cpu")\n'
            'print(runner["meta"]["iter"], runner["message_hub"]["log_scalars"]["train/loss"].mean() > 0,'
            ' timm["args"].model, [str(w.message) for w in seen if "mmsoft" in str(w.message)])\n'
            'try:\n'
            '    c.load(sys.argv[3])\n'
            'except c.UntrustedCheckpointError as err:\n'
            '    print("fraction", "fractions.Fraction" in err.reason, c.TRUSTED_ENV in str(err))\n'
            'with c.trust(sys.argv[3]):\n'
            '    print("trusted", c.load(sys.argv[3])["meta"]["ratio"])\n'
            'for f in sys.argv[4:]:\n'
            '    try:\n'
            '        c.load(f)\n'
            '        print("loaded", f)\n'
            '    except c.UntrustedCheckpointError as err:\n'
            '        print("refused", bool(err.reason) and err.reason in str(err))\n')
    res = subprocess.run([sys.executable, '-c', code,
                          str(runner_checkpoint), str(timm_checkpoint),
                          str(_benign_unlisted(tmp_path)), *crafted],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    said = [line for line in res.stdout.splitlines() if ' - mmengine - ' not in line]
    assert said[-3 - len(crafted):] == [
        '2 True xcit_tiny []', 'fraction True True', 'trusted 1/3'] + ['refused True'] * len(crafted), \
        res.stdout + res.stderr[-2000:]
    assert not list(tmp_path.glob('ran_*'))


def test_timm_checkpoint_loads(timm_checkpoint, tmp_path, http_server):
    os.link(timm_checkpoint, tmp_path / 'timm.pth')
    for entry in ['CheckpointLoader', 'CheckpointLoader_url', 'mmsoft.checkpoint.load']:
        loaded = _load_via(entry, tmp_path / 'timm.pth', tmp_path, http_server)
        assert loaded['args'].model == 'xcit_tiny' and 'linear.weight' in loaded['model']


def test_mmcls_scheme_keeps_the_backbone(tmp_path, http_server, monkeypatch):
    """``mmcls://`` returns the classifier's backbone weights without their prefix, as
    mmengine's own loader of that scheme does."""
    path = tmp_path / 'classifier.pth'
    torch.save({'state_dict': {'backbone.conv.weight': torch.ones(1),
                               'head.fc.weight': torch.zeros(1)}, 'meta': {}}, path)
    loaded = _load_via('mmcls_url', path, tmp_path, http_server, monkeypatch)
    assert list(loaded) == ['state_dict'] and list(loaded['state_dict']) == ['conv.weight']


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


@pytest.mark.parametrize('entry', ['pavi', 's3'])
def test_remote_file_is_trusted_by_its_name(entry, tmp_path, monkeypatch):
    """A ``pavi://`` or ``s3://`` checkpoint is read from a temporary copy or from memory;
    the user trusts it by the name they load it with."""
    from mmengine.runner import CheckpointLoader
    path = _benign_unlisted(tmp_path)
    name = f'{entry}://mmsoft/{osp.basename(path)}'
    with pytest.raises(mmsoft_checkpoint.UntrustedCheckpointError, match=re.escape(
            f'{mmsoft_checkpoint.TRUSTED_ENV}={name}')):
        _load_via(entry, path, tmp_path, monkeypatch=monkeypatch)
    with mmsoft_checkpoint.trust(name):
        loaded = CheckpointLoader.load_checkpoint(name)
    assert loaded['meta']['ratio'] == fractions.Fraction(1, 3)


# ------------------------------------------------------------------- threads
def _in_thread(target, *args):
    """Run ``target(*args)`` in a new thread; the thread and a list that receives what it
    returned or raised."""
    result = []

    def run():
        try:
            result.append(target(*args))
        except Exception as e:  # noqa: B902  (the test looks at it)
            result.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def _hold_trust(path, entered, release):
    with mmsoft_checkpoint.trust(path):
        entered.set()
        assert release.wait(30)


def test_trust_holds_for_every_thread_while_its_block_is_open(tmp_path):
    """A trust() grant is process-wide, like MMSOFT_TRUSTED_CHECKPOINTS: a file trusted in
    one thread's open block loads in full in another thread; once the block closes it is
    refused there again."""
    from mmengine.runner import CheckpointLoader
    path = _benign_unlisted(tmp_path)
    entered, release = threading.Event(), threading.Event()
    holder, held = _in_thread(_hold_trust, path, entered, release)
    try:
        assert entered.wait(30)
        thread, result = _in_thread(CheckpointLoader.load_checkpoint, str(path))
        thread.join(60)
        assert result[0]['meta']['ratio'] == fractions.Fraction(1, 3), result
    finally:
        release.set()
        holder.join(30)
    assert held == [None]
    thread, result = _in_thread(CheckpointLoader.load_checkpoint, str(path))
    thread.join(60)
    assert isinstance(result[0], mmsoft_checkpoint.UntrustedCheckpointError), result


def test_overlapping_trust_blocks_of_two_threads(tmp_path):
    """Two threads trust the same file in blocks that overlap: it stays trusted until the
    last of them closes, whichever opened first."""
    path = _benign_unlisted(tmp_path)
    events = [(threading.Event(), threading.Event()) for _ in range(2)]
    threads = []
    try:
        for entered, release in events:
            threads.append(_in_thread(_hold_trust, path, entered, release)[0])
            assert entered.wait(30)
        assert mmsoft_checkpoint.is_trusted(path)
        events[0][1].set()  # the first block closes
        threads[0].join(30)
        assert mmsoft_checkpoint.is_trusted(path)
        assert mmsoft_checkpoint.load(path)['meta']['ratio'] == fractions.Fraction(1, 3)
    finally:
        for _, release in events:
            release.set()
        for thread in threads:
            thread.join(30)
    assert not mmsoft_checkpoint.is_trusted(path)


def test_concurrent_refusals_stay_with_their_own_call(tmp_path):
    """Threads loading at the same time, some files refused and one trusted: each refusal
    names its own file and reason, nothing of another thread's; the trusted file loads."""
    from mmengine.runner import CheckpointLoader
    from mmengine.runner import checkpoint as mmengine_checkpoint
    crafted = [_crafted(tmp_path, payload) for payload in PAYLOADS for _ in range(2)]
    trusted = _benign_unlisted(tmp_path)
    loaders = [CheckpointLoader.load_checkpoint,  # through mmsoft's scheme
               lambda f: mmengine_checkpoint.load_from_local(f, None)]  # mmengine's, by name
    jobs = [(loaders[i % 2], str(path)) for i, (path, _) in enumerate(crafted)]
    jobs.append((loaders[0], str(trusted)))
    start = threading.Barrier(len(jobs))

    def job(load, f):
        start.wait(30)
        return load(f)

    with mmsoft_checkpoint.trust(trusted):
        runs = [_in_thread(job, load, f) for load, f in jobs]
        for thread, _ in runs:
            thread.join(120)
    for (path, marker), (_, result) in zip(crafted, runs):
        err = result[0]
        assert isinstance(err, mmsoft_checkpoint.UntrustedCheckpointError), err
        assert err.source == str(path) and repr(str(path)) in str(err)
        assert err.reason and err.reason in str(err)
        others = [str(p) for p, _ in crafted if p != path] + [str(trusted)]
        assert not any(other in str(err) for other in others)
        assert not marker.exists()
    assert runs[-1][1][0]['meta']['ratio'] == fractions.Fraction(1, 3)


def test_missing_imagenet_weights_say_where_they_come_from(tmp_path):
    """A config's checkpoints/ file that is not there (no weights ship with mmsoft) names
    where to get it; a missing file elsewhere keeps mmengine's plain message."""
    from mmengine.runner import CheckpointLoader
    (tmp_path / 'checkpoints').mkdir()
    with pytest.raises(FileNotFoundError, match='ships no weights.*faq.md'):
        CheckpointLoader.load_checkpoint(str(tmp_path / 'checkpoints' / 'soft_small_norm.pth'))
    with pytest.raises(FileNotFoundError) as err:
        CheckpointLoader.load_checkpoint(str(tmp_path / 'elsewhere.pth'))
    assert str(err.value).endswith('can not be found.')
