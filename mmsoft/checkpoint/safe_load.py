"""Checkpoint loading that keeps torch's ``weights_only`` protection on.

torch >= 2.6 unpickles checkpoints with ``weights_only=True``: only allow-listed classes and
functions may be called. mmengine's own checkpoints need a few more (numpy arrays, scalars
and dtypes in the message hub, mmengine's ``HistoryBuffer``) and timm checkpoints hold an
``argparse.Namespace``. mmsoft allows exactly these, and only while mmsoft or mmengine
loads a checkpoint (:func:`safe_globals`); a plain ``torch.load`` elsewhere in the process
keeps torch's own allow-list.

``HistoryBuffer`` pickles its statistics methods as ``getattr(HistoryBuffer, 'min')``.
Allow-listing ``builtins.getattr`` itself would let a crafted file walk from any allowed
object to ``eval`` (``getattr(getattr, '__self__')`` is the ``builtins`` module, and torch's
allowed ``_rebuild_from_type_v2`` calls whatever it is given). The name ``builtins.getattr``
therefore resolves to :func:`history_buffer_statistic`, which returns
``HistoryBuffer.min/max/current/mean`` and refuses everything else.

``import mmsoft`` routes mmengine's checkpoint loading through :func:`load`
(:func:`guard_mmengine`): ``init_cfg=dict(type='Pretrained')``, ``load_from``, ``resume``,
``mmengine.runner.load_checkpoint``, ``CheckpointLoader.load_checkpoint``, local files,
URLs and ``torchvision://`` / ``open-mmlab://`` names. mmengine loads URLs with
``weights_only=False`` and onedl-mmengine retries a refused file with
``weights_only=False``; mmsoft refuses both unless the user has said the file is trusted
(:func:`trust`, ``MMSOFT_TRUSTED_CHECKPOINTS``).
"""
import argparse
import contextlib
import functools
import os
import os.path as osp
import pickle
import re
import threading
import types

import numpy as np
import torch

__all__ = ['TRUSTED_ENV', 'UntrustedCheckpointError', 'history_buffer_statistic',
           'mmengine_checkpoint_globals', 'safe_globals', 'trust', 'is_trusted', 'load',
           'guard_mmengine']

TRUSTED_ENV = 'MMSOFT_TRUSTED_CHECKPOINTS'
HISTORY_BUFFER_STATISTICS = ('min', 'max', 'current', 'mean')
_GETATTR_NAME = 'builtins.getattr'


class UntrustedCheckpointError(pickle.UnpicklingError):
    """A checkpoint needs more than ``weights_only`` unpickling and nobody trusted it."""


def history_buffer_statistic(owner, name):
    """What ``builtins.getattr`` resolves to while mmsoft loads a checkpoint."""
    from mmengine.logging import HistoryBuffer
    if owner is HistoryBuffer and name in HISTORY_BUFFER_STATISTICS:
        return getattr(HistoryBuffer, name)
    owner = 'getattr' if owner is history_buffer_statistic else repr(owner)
    raise pickle.UnpicklingError(
        f'the checkpoint calls getattr({owner}, {name!r}); mmsoft lets checkpoints use '
        f'getattr only for HistoryBuffer.{"/".join(HISTORY_BUFFER_STATISTICS)}')


def _numeric_dtype_classes():
    # numpy >= 1.25 pickles dtypes through their DType class; object, string and void
    # dtypes are left out: mmengine and timm checkpoints hold numbers only.
    if not hasattr(np, 'dtypes'):
        return []
    classes = (getattr(np.dtypes, name) for name in dir(np.dtypes) if name.endswith('DType'))
    return [c for c in classes
            if isinstance(getattr(c, 'type', None), type) and issubclass(c.type, (
                np.number, np.bool_, np.datetime64, np.timedelta64))]


def mmengine_checkpoint_globals():
    """The allow-list entries mmengine and timm checkpoints need, for
    ``torch.serialization.safe_globals``."""
    from mmengine.logging.history_buffer import HistoryBuffer
    try:
        from numpy._core.multiarray import _reconstruct, scalar
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct, scalar
    return [_reconstruct, scalar, np.ndarray, np.dtype, *_numeric_dtype_classes(),
            HistoryBuffer, argparse.Namespace, (history_buffer_statistic, _GETATTR_NAME)]


def _global_name(entry):
    if isinstance(entry, tuple):
        return entry[1]
    return f'{getattr(entry, "__module__", "")}.{getattr(entry, "__qualname__", "")}'


_allow_list_lock = threading.RLock()


@contextlib.contextmanager
def safe_globals():
    """Allow :func:`mmengine_checkpoint_globals` for ``torch.load(weights_only=True)`` in
    the block. Any raw ``builtins.getattr`` allow-listed by others (onedl-mmengine adds
    one around its own loads) is withdrawn for the block. A checkpoint that changes
    ``HistoryBuffer``'s statistics table (shared by the whole process) is refused."""
    from mmengine.logging import HistoryBuffer
    serialization = torch.serialization
    with _allow_list_lock:
        before = serialization.get_safe_globals()
        table = dict(HistoryBuffer._statistics_methods)
        serialization.clear_safe_globals()
        serialization.add_safe_globals(
            [g for g in before if _global_name(g) != _GETATTR_NAME]
            + mmengine_checkpoint_globals())
        try:
            yield
        finally:
            serialization.clear_safe_globals()
            serialization.add_safe_globals(before)
            # Unpickling a HistoryBuffer fills in its own four statistics (mmengine's
            # __setstate__), also in a fresh process whose table is still empty.
            expected = {name: getattr(HistoryBuffer, name)
                        for name in HISTORY_BUFFER_STATISTICS}
            expected.update(table)
            changed = HistoryBuffer._statistics_methods not in (table, expected)
            if changed:
                HistoryBuffer._statistics_methods.clear()
                HistoryBuffer._statistics_methods.update(table)
        if changed:
            raise pickle.UnpicklingError(
                'the checkpoint replaces statistics methods of mmengine\'s HistoryBuffer '
                '(process-wide state); mmsoft restored them')


_trusted_here = []  # paths given to trust(), innermost last


@contextlib.contextmanager
def trust(*paths):
    """Let :func:`load` (and mmengine's loading, once mmsoft is imported) fully unpickle
    the given checkpoint files (or URLs) in the block when ``weights_only`` refuses them.

    Full unpickling runs any code the file contains: trust only files you made or that
    come from a source you trust. ``MMSOFT_TRUSTED_CHECKPOINTS`` (paths separated by
    ``os.pathsep``) does the same for a whole process."""
    if not paths or not all(isinstance(p, (str, os.PathLike)) for p in paths):
        raise TypeError('trust() takes one or more checkpoint paths or URLs')
    keys = [_trust_key(p) for p in paths]
    _trusted_here.extend(keys)
    try:
        yield
    finally:
        for k in keys:
            _trusted_here.remove(k)


def _trust_key(path):
    path = os.fspath(path)
    if '://' in path:
        return path
    return osp.realpath(osp.expanduser(path))


def is_trusted(f):
    """Whether ``f`` (a path or URL; never a file object) was trusted by the user."""
    if not isinstance(f, (str, os.PathLike)):
        return False
    return _trust_key(f) in set(_trusted_here) | {_trust_key(p) for p in _env_entries()}


def _env_entries():
    value = os.environ.get(TRUSTED_ENV, '')
    if os.pathsep != ':':
        parts = value.split(os.pathsep)
    else:  # the colons of a URL (after its scheme, before its port) separate nothing
        parts = re.findall(r'[A-Za-z][A-Za-z0-9+.-]*://[^/:]*(?::\d+)?[^:]*|[^:]+', value)
    return [p.strip() for p in parts if p.strip()]


def _refusal(f, reason, asked_for_full_unpickling=False):
    name = os.fspath(f) if isinstance(f, (str, os.PathLike)) else None
    shown = repr(name) if name else f'from a {type(f).__name__} object'
    msg = [f'mmsoft refused to load checkpoint {shown}: {reason}.']
    if asked_for_full_unpickling:
        msg.append('mmengine asked torch to unpickle it with weights_only=False (which '
                   'onedl-mmengine does after weights_only=True failed); mmsoft does not '
                   'allow that for a file nobody trusted.')
    msg.append('Full unpickling runs any code a crafted checkpoint contains, so mmsoft '
               'loads checkpoints with weights_only=True plus what mmengine and timm '
               'checkpoints need.')
    if name:
        key = _trust_key(name)
        msg.append(f'If you trust this file (you made it, or it comes from a source you '
                   f'trust), opt in for it: set {TRUSTED_ENV}={key} (several paths '
                   f'separated by "{os.pathsep}"), or load it inside '
                   f'`with mmsoft.checkpoint.trust({key!r}):`.')
    else:
        msg.append('A file object cannot be trusted by name: save it to a file and trust '
                   f'that path ({TRUSTED_ENV} or mmsoft.checkpoint.trust).')
    return ' '.join(msg)


def _reason(err):
    """What torch's weights_only unpickler refused, without its generic advice."""
    lines = []
    for line in str(err).splitlines():
        line = line.split('WeightsUnpickler error:')[-1].strip()
        if line and not line.startswith(('Weights only load failed', 'Check the documentation',
                                         '(1) In PyTorch', '(2) Alternatively')):
            lines.append(line)
    return ' '.join(lines).rstrip('.') or type(err).__name__


def _warn_full_unpickling(f):
    from mmengine.logging import print_log
    print_log(f'mmsoft: unpickling {os.fspath(f)!r} without weights_only because it is '
              f'trusted ({TRUSTED_ENV} or mmsoft.checkpoint.trust)', logger='current',
              level=30)


def _weights_only_first(source, call):
    """``call(True)`` (weights_only) inside :func:`safe_globals`; what that refuses is
    ``call(False)`` (full unpickling) only if ``source`` :func:`is_trusted`, else
    :class:`UntrustedCheckpointError` says why and how to opt in."""
    try:
        with safe_globals():
            return call(True)
    except pickle.UnpicklingError as err:
        if not is_trusted(source):
            _last_refusal.value = (source, _reason(err))
            raise UntrustedCheckpointError(_refusal(source, _reason(err))) from err
    _warn_full_unpickling(source)
    return call(False)


def _refuse_unless_trusted(source, reason):
    """An explicit ``weights_only=False`` request for an untrusted ``source``."""
    if not is_trusted(source):
        raise UntrustedCheckpointError(_refusal(source, reason, asked_for_full_unpickling=True))


def load(f, map_location=None, **kwargs):
    """``torch.load(f, weights_only=True)`` with mmsoft's allow-list; what it refuses is
    unpickled in full only if :func:`is_trusted`, else :class:`UntrustedCheckpointError`
    (an ``UnpicklingError``) says why and how to opt in."""
    return _weights_only_first(f, lambda weights_only: torch.load(
        f, map_location=map_location, weights_only=weights_only, **kwargs))


_last_refusal = threading.local()  # (file, reason) of load()'s last refusal in the thread


def _mmengine_torch_load(f, *args, **kwargs):
    """``torch.load`` as mmengine's checkpoint module sees it once mmsoft is imported."""
    if kwargs.get('weights_only') is False:  # onedl-mmengine's retry, or any caller
        last, reason = getattr(_last_refusal, 'value', (None, None))
        _refuse_unless_trusted(f, reason if last is f else
                               'the caller asked for weights_only=False')
        _warn_full_unpickling(f)
        return torch.load(f, *args, **kwargs)
    kwargs.pop('weights_only', None)
    if args:  # torch.load(f, map_location, pickle_module)
        kwargs.setdefault('map_location', args[0])
        if len(args) > 1 and args[1] is not None:
            raise TypeError('mmsoft: torch.load with a pickle_module cannot keep weights_only')
    return load(f, **kwargs)


def _mmengine_load_url(original, url, *args, **kwargs):
    """mmengine's ``load_url`` (torch.hub's, whose default is weights_only=False)."""
    if kwargs.pop('weights_only', None) is False:
        _refuse_unless_trusted(url, 'the caller asked for weights_only=False')
    return _weights_only_first(url, lambda weights_only: original(
        url, *args, weights_only=weights_only, **kwargs))


class _GuardedTorch(types.ModuleType):
    """Stands in for ``torch`` in one mmengine module: ``load`` is mmsoft's, every other
    attribute is torch's."""

    def __init__(self, real):
        super().__init__(real.__name__, real.__doc__)
        self.__dict__['_mmsoft_real_torch'] = real
        self.load = _mmengine_torch_load

    def __getattr__(self, name):
        return getattr(self.__dict__['_mmsoft_real_torch'], name)

    def __dir__(self):
        return sorted(set(dir(self.__dict__['_mmsoft_real_torch'])) | set(self.__dict__))


def guard_mmengine():
    """Route mmengine's checkpoint loading (``mmengine.runner.checkpoint``: every scheme
    of ``CheckpointLoader``, and with it ``load_checkpoint``, ``Runner.load_checkpoint``,
    ``resume`` and ``init_cfg``) through :func:`load`. Idempotent."""
    if not all(hasattr(torch.serialization, f) for f in (
            'get_safe_globals', 'clear_safe_globals', 'add_safe_globals')):
        return  # torch < 2.5: no allow-list to scope (and no weights_only default)
    from mmengine.runner import checkpoint as module
    if not isinstance(module.torch, _GuardedTorch):
        module.torch = _GuardedTorch(module.torch)
    load_url = getattr(module, 'load_url', None)
    if load_url is not None and not getattr(load_url, '_mmsoft_guarded', False):
        guarded = functools.wraps(load_url)(functools.partial(_mmengine_load_url, load_url))
        guarded._mmsoft_guarded = True
        module.load_url = guarded
