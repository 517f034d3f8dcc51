"""The rules of mmsoft's restricted unpickler (torch < 2.5), checked on every torch with
hand-written pickles: what a checkpoint does not need is refused, nothing is imported or
changed on the way."""
import io
import pickle
import struct
import sys

import pytest

from mmsoft.checkpoint import restricted_pickle


def _text(value):
    data = value.encode()
    return b'X' + struct.pack('<I', len(data)) + data  # BINUNICODE


def _global(module, name):
    return b'c' + module.encode() + b'\n' + name.encode() + b'\n'


def _load(body):
    return restricted_pickle.load(io.BytesIO(b'\x80\x02' + body + b'.'))


def test_allowed_globals_load():
    """What mmengine's checkpoints spell: an OrderedDict, numpy's scalar (numpy 1 and 2
    module names) through getattr(HistoryBuffer, 'min')."""
    from mmengine.logging import HistoryBuffer
    loaded = _load(_global('collections', 'OrderedDict') + b')R')
    assert type(loaded).__name__ == 'OrderedDict'
    method = _load(_global('__builtin__', 'getattr') + _global(
        'mmengine.logging.history_buffer', 'HistoryBuffer') + _text('min') + b'\x86R')
    assert method is HistoryBuffer.min
    names = restricted_pickle.allowed_globals()
    assert names['numpy.core.multiarray.scalar'] is names['numpy._core.multiarray.scalar']


@pytest.mark.parametrize('protocol', [2, 4])
def test_plain_types_torch_admits_load(protocol):
    """The plain types torch >= 2.5's weights_only admits, as pickle writes them: a
    Counter (mmengine's MultiStepLR milestones), a set, a bytearray, a complex, a device."""
    import collections

    import torch
    value = {'milestones': collections.Counter({8: 1, 11: 1}), 'ids': {1, 2},
             'raw': bytearray(b'ab'), 'z': 1 + 2j, 'device': torch.device('cpu')}
    loaded = restricted_pickle.load(io.BytesIO(pickle.dumps(value, protocol=protocol)))
    assert loaded == value and type(loaded['milestones']) is collections.Counter


def test_unlisted_global_is_named_and_never_imported(tmp_path, monkeypatch):
    marker = tmp_path / 'imported'
    (tmp_path / 'mmsoft_side_effect.py').write_text(
        f'import pathlib\npathlib.Path({str(marker)!r}).touch()\nvalue = 1\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(restricted_pickle.RefusedGlobal, match='mmsoft_side_effect.value'):
        _load(_global('mmsoft_side_effect', 'value'))
    assert not marker.exists() and 'mmsoft_side_effect' not in sys.modules
    with pytest.raises(restricted_pickle.RefusedGlobal, match='GLOBAL os.system'):
        _load(_global('os', 'system') + _text('true') + b'\x85R')


def test_state_goes_only_into_instances_of_allowed_classes():
    """BUILD on the HistoryBuffer class itself would set a process-wide attribute."""
    from mmengine.logging import HistoryBuffer
    state = b'N}' + _text('mmsoft_crafted') + b'K\x01s\x86'  # (None, {'mmsoft_crafted': 1})
    with pytest.raises(restricted_pickle.RefusedGlobal, match='sets the state of type'):
        _load(_global('mmengine.logging.history_buffer', 'HistoryBuffer') + state + b'b')
    assert not hasattr(HistoryBuffer, 'mmsoft_crafted')
    namespace = _load(_global('argparse', 'Namespace') + b')R}' + _text('lr') + b'K\x02sb')
    assert namespace.lr == 2


def test_only_allowed_globals_are_called():
    """A callable the file built (here HistoryBuffer.min, from the allowed getattr) is
    not called."""
    method = (_global('__builtin__', 'getattr')
              + _global('mmengine.logging.history_buffer', 'HistoryBuffer') + _text('min')
              + b'\x86R')
    with pytest.raises(restricted_pickle.RefusedGlobal, match='calls function'):
        _load(method + b')R')
    with pytest.raises(pickle.UnpicklingError, match='getattr only for HistoryBuffer'):
        _load(_global('__builtin__', 'getattr') + _global('collections', 'OrderedDict')
              + _text('__init__') + b'\x86R')
