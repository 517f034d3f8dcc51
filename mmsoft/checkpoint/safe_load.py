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

torch < 2.5 has no way to extend ``weights_only``'s list; there mmsoft reads with a
restricted unpickler of its own instead (:mod:`mmsoft.checkpoint.restricted_pickle`,
``torch.load``'s ``pickle_module``), which admits the same globals and refuses the rest
with the same :class:`UntrustedCheckpointError`: every stack refuses what the others do.

``import mmsoft`` routes mmengine's checkpoint loading through :func:`load`
(:func:`mmsoft.checkpoint.guard_mmengine`). mmengine loads URLs with ``weights_only=False``
and onedl-mmengine retries a refused file with ``weights_only=False``; mmsoft refuses both
unless the user has said the file is trusted (:func:`trust`, ``MMSOFT_TRUSTED_CHECKPOINTS``).

Trust is a fact about a file, stated by the user, so it holds for the whole process: the
environment variable from the start, a :func:`trust` block while it is open, in every
thread. A refusal is not state: each :class:`UntrustedCheckpointError` carries its own
file and reason.
"""
import collections
import contextlib
import os
import os.path as osp
import pickle
import re
import threading

import torch

from . import restricted_pickle
from .allow_list import (_GETATTR_NAME, HISTORY_BUFFER_STATISTICS, history_buffer_statistic,
                         mmengine_checkpoint_globals)

__all__ = ['ALLOW_LIST', 'TRUSTED_ENV', 'UntrustedCheckpointError', 'history_buffer_statistic',
           'history_buffer_table_kept', 'mmengine_checkpoint_globals', 'protection',
           'safe_globals', 'trust', 'is_trusted', 'load']

TRUSTED_ENV = 'MMSOFT_TRUSTED_CHECKPOINTS'
# torch >= 2.5 lets the weights_only unpickler allow more (torch.serialization's
# get/clear/add_safe_globals); older torch has its fixed list, which refuses mmengine's
# and timm's checkpoints, so there mmsoft's restricted unpickler reads instead
# (:func:`protection`).
ALLOW_LIST = all(hasattr(torch.serialization, f) for f in (
    'get_safe_globals', 'clear_safe_globals', 'add_safe_globals'))


class UntrustedCheckpointError(pickle.UnpicklingError):
    """A checkpoint needs more than ``weights_only`` unpickling and nobody trusted it.

    ``source`` is what was refused (a path, URL or file object) and ``reason`` what
    ``weights_only`` refused in it (None where a caller asked for full unpickling of a file
    whose first refusal it did not pass on)."""

    def __init__(self, message, source=None, reason=None):
        super().__init__(message)
        self.source = source
        self.reason = reason


def _global_name(entry):
    if isinstance(entry, tuple):
        return entry[1]
    return f'{getattr(entry, "__module__", "")}.{getattr(entry, "__qualname__", "")}'


_allow_list_lock = threading.RLock()


@contextlib.contextmanager
def history_buffer_table_kept():
    """Refuse (``UnpicklingError``, after restoring it) a checkpoint read in the block
    that changes ``HistoryBuffer``'s statistics table, which the whole process shares.
    Unpickling a HistoryBuffer fills in its own four statistics (mmengine's
    ``__setstate__``), also in a fresh process whose table is still empty: that is no
    change. Blocks of several threads take turns."""
    from mmengine.logging import HistoryBuffer
    with _allow_list_lock:
        table = dict(HistoryBuffer._statistics_methods)
        try:
            yield
        finally:
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


@contextlib.contextmanager
def safe_globals():
    """Allow :func:`mmengine_checkpoint_globals` for ``torch.load(weights_only=True)`` in
    the block (torch >= 2.5). Any raw ``builtins.getattr`` allow-listed by others
    (onedl-mmengine adds one around its own loads) is withdrawn for the block. A
    checkpoint that changes ``HistoryBuffer``'s statistics table (shared by the whole
    process) is refused (:func:`history_buffer_table_kept`).

    torch's allow-list is one for the whole process: blocks of several threads take turns
    (a lock), but code that adds ``builtins.getattr`` from another thread while the block
    runs, without this lock, would reach the load (mmengine's checkpoint module cannot:
    :mod:`mmsoft.checkpoint.guard`)."""
    if not ALLOW_LIST:
        raise RuntimeError(f'torch {torch.__version__} has no weights_only allow-list '
                           '(torch >= 2.5); mmsoft reads with its restricted unpickler '
                           'there (mmsoft.checkpoint.protection)')
    serialization = torch.serialization
    with _allow_list_lock, history_buffer_table_kept():
        before = serialization.get_safe_globals()
        serialization.clear_safe_globals()
        serialization.add_safe_globals(
            [g for g in before if _global_name(g) != _GETATTR_NAME]
            + mmengine_checkpoint_globals())
        try:
            yield
        finally:
            serialization.clear_safe_globals()
            serialization.add_safe_globals(before)


_trusted_lock = threading.Lock()
_trusted = collections.Counter()  # trust() keys of the open blocks, all threads


@contextlib.contextmanager
def trust(*paths):
    """Let :func:`load` (and mmengine's loading, once mmsoft is imported) fully unpickle
    the given checkpoint files (or URLs) while the block runs, when ``weights_only``
    refuses them.

    The grant holds for the whole process, in every thread, as long as the block is open
    (blocks of several threads naming the same file overlap: it stays trusted until the
    last one closes). Full unpickling runs any code the file contains: trust only files you
    made or that come from a source you trust. ``MMSOFT_TRUSTED_CHECKPOINTS`` (paths
    separated by ``os.pathsep``) does the same for the life of the process."""
    if not paths or not all(isinstance(p, (str, os.PathLike)) for p in paths):
        raise TypeError('trust() takes one or more checkpoint paths or URLs')
    keys = [_trust_key(p) for p in paths]
    with _trusted_lock:
        _trusted.update(keys)
    try:
        yield
    finally:
        with _trusted_lock:
            _trusted.subtract(keys)
            for k in keys:
                if _trusted[k] <= 0:
                    del _trusted[k]


def _trust_key(path):
    path = os.fspath(path)
    if '://' in path:
        return path
    return osp.realpath(osp.expanduser(path))


def is_trusted(f):
    """Whether ``f`` (a path or URL; never a file object) was trusted by the user."""
    if not isinstance(f, (str, os.PathLike)):
        return False
    key = _trust_key(f)
    with _trusted_lock:
        if _trusted[key] > 0:
            return True
    return key in {_trust_key(p) for p in _env_entries()}


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
               'checkpoints need (on torch < 2.5, with a restricted unpickler that admits '
               'the same).')
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


def protection(protected):
    """The ``torch.load`` arguments of a protected read (``protected``: torch's
    ``weights_only``, or on torch < 2.5 mmsoft's restricted unpickler) or of full
    unpickling."""
    if not protected:
        return {'weights_only': False}
    if ALLOW_LIST:
        return {'weights_only': True}
    return {'weights_only': False, 'pickle_module': restricted_pickle}


@contextlib.contextmanager
def _protected_block():
    """Around a protected read: :func:`safe_globals` where torch has an allow-list; on
    torch < 2.5 the restricted unpickler needs no process-wide state, and only
    HistoryBuffer's statistics table is checked (:func:`history_buffer_table_kept`)."""
    if ALLOW_LIST:
        with safe_globals():
            yield
    else:
        with history_buffer_table_kept():
            yield


def _weights_only_first(source, call):
    """``call(True)`` (a protected read: ``torch.load(**protection(True))``) inside
    :func:`_protected_block`; what that refuses is ``call(False)`` (full unpickling) only if
    ``source`` :func:`is_trusted`, else :class:`UntrustedCheckpointError` says why and how
    to opt in."""
    try:
        with _protected_block():
            return call(True)
    except pickle.UnpicklingError as err:
        if not is_trusted(source):
            reason = _reason(err)
            raise UntrustedCheckpointError(_refusal(source, reason), source, reason) from err
    _warn_full_unpickling(source)
    return call(False)


def _refuse_unless_trusted(source, reason=None):
    """An explicit ``weights_only=False`` request for ``source``: refused with
    :class:`UntrustedCheckpointError` unless it is trusted. ``reason`` is what
    ``weights_only`` refused in the file, where the caller knows it."""
    if not is_trusted(source):
        shown = reason or 'the caller asked for weights_only=False'
        raise UntrustedCheckpointError(
            _refusal(source, shown, asked_for_full_unpickling=True), source, reason)


def load(f, map_location=None, **kwargs):
    """``torch.load(f, weights_only=True)`` with mmsoft's allow-list; what it refuses is
    unpickled in full only if :func:`is_trusted`, else :class:`UntrustedCheckpointError`
    (an ``UnpicklingError``) says why and how to opt in."""
    return _weights_only_first(f, lambda protected: torch.load(
        f, map_location=map_location, **protection(protected), **kwargs))
