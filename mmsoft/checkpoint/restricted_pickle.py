"""A restricted unpickler, for ``torch.load(f, weights_only=False, pickle_module=...)``
where torch has no ``weights_only`` allow-list to extend (torch < 2.5).

Used as the ``pickle_module`` of ``torch.load`` (it has ``Unpickler`` and ``load``, all
torch asks of one). Three rules, the same torch's own ``weights_only`` unpickler keeps:

1. **Globals by name.** A ``GLOBAL`` (or ``STACK_GLOBAL`` / extension code) resolves only
   if its full name is in :func:`allowed_globals`; the name is checked before anything is
   imported, so a crafted file cannot even import a module. The list is what real
   checkpoints reference (read from the files, with ``pickletools``): torch's tensor and
   parameter rebuilds, ``torch.Size``, ``torch.device`` and torch's dtypes,
   ``collections.OrderedDict``, ``collections.Counter`` (mmengine's ``MultiStepLR`` keeps
   its milestones in one), ``set``, ``bytearray``, ``complex``, ``_codecs.encode`` (how
   protocol 2 spells bytes): the plain types torch >= 2.5's own list admits, so a file
   loads on every torch alike; and
   what mmengine's ``save_checkpoint`` and timm's training checkpoints add
   (:func:`mmsoft.checkpoint.mmengine_checkpoint_globals`: numpy arrays, scalars and
   dtypes, mmengine's ``HistoryBuffer``, ``argparse.Namespace``, and ``builtins.getattr``
   resolved to :func:`~mmsoft.checkpoint.history_buffer_statistic`). torch's storage
   classes never reach this check: torch's own wrapper of this unpickler resolves them.
2. **Calls of allowed globals only.** ``REDUCE`` and ``NEWOBJ`` call what they find on the
   stack only if it is one of the allowed globals, never an object the file built.
3. **State only into instances of allowed classes.** ``BUILD`` sets the state of an
   instance of an allowed class (through its ``__setstate__`` or ``__dict__``), never of a
   class, function or module, whose attributes are process-wide.

Anything else raises :class:`RefusedGlobal` (a ``pickle.UnpicklingError``) naming what was
refused; :func:`mmsoft.checkpoint.load` turns it into ``UntrustedCheckpointError``.
Built on Python's own ``pickle._Unpickler`` (the pure-Python one), whose opcodes can be
overridden one by one; a checkpoint's pickle is small (tensor data are read apart, by
torch), so its speed does not matter.
"""
import _compat_pickle
import functools
import pickle
import types

from .allow_list import mmengine_checkpoint_globals

__all__ = ['RefusedGlobal', 'Unpickler', 'load', 'allowed_globals']


class RefusedGlobal(pickle.UnpicklingError):
    """The restricted unpickler met something a checkpoint does not need."""


@functools.lru_cache(maxsize=None)
def _allowed():
    import codecs
    import collections

    import torch

    entries = {}

    def add(obj, name=None):
        name = name or f'{obj.__module__}.{obj.__qualname__}'
        entries[name] = obj
        if name.startswith(('numpy.core.', 'numpy._core.')):  # numpy 1 and 2 spell them
            tail = name.split('core.', 1)[1]
            entries[f'numpy.core.{tail}'] = entries[f'numpy._core.{tail}'] = obj

    for name in ('_rebuild_tensor_v2', '_rebuild_parameter', '_rebuild_parameter_with_state'):
        if hasattr(torch._utils, name):
            add(getattr(torch._utils, name), f'torch._utils.{name}')
    add(torch.Size, 'torch.Size')
    add(torch.device, 'torch.device')
    for name in dir(torch):
        if isinstance(getattr(torch, name, None), torch.dtype):
            add(getattr(torch, name), f'torch.{name}')
    add(collections.OrderedDict, 'collections.OrderedDict')
    add(collections.Counter, 'collections.Counter')
    for plain in (set, bytearray, complex):
        add(plain, f'builtins.{plain.__name__}')  # protocol 2: __builtin__.*, mapped
    add(codecs.encode, '_codecs.encode')  # bytes in protocol 2 (numpy scalars' data)
    for entry in mmengine_checkpoint_globals():
        if isinstance(entry, tuple):
            add(*entry)
        else:
            add(entry)
    return types.SimpleNamespace(
        names=entries,  # full name -> object: what GLOBAL may resolve
        ids={id(obj) for obj in entries.values()},  # what REDUCE / NEWOBJ may call
        classes=tuple(obj for obj in entries.values() if isinstance(obj, type)))  # BUILD


def allowed_globals():
    """``{full name: object}`` of what a checkpoint may reference."""
    return dict(_allowed().names)


class Unpickler(pickle._Unpickler):
    """``pickle``'s unpickler with the three rules of this module."""

    def find_class(self, module, name):
        if self.proto < 3 and self.fix_imports:  # Python 2 names, as pickle maps them
            if (module, name) in _compat_pickle.NAME_MAPPING:
                module, name = _compat_pickle.NAME_MAPPING[(module, name)]
            elif module in _compat_pickle.IMPORT_MAPPING:
                module = _compat_pickle.IMPORT_MAPPING[module]
        full = f'{module}.{name}'
        entries = _allowed().names
        if full not in entries:
            raise RefusedGlobal(f'Unsupported global: GLOBAL {full} was not an allowed global '
                                '(what mmengine, timm and the official releases write)')
        return entries[full]

    def _callable(self, func):
        if id(func) not in _allowed().ids:
            raise RefusedGlobal(f'the checkpoint calls {type(func).__name__} object '
                                f'{func!r:.80}, which is not an allowed global')
        return func

    def load_reduce(self):
        args = self.stack.pop()
        self.stack[-1] = self._callable(self.stack[-1])(*args)

    def load_newobj(self):
        args = self.stack.pop()
        cls = self._callable(self.stack.pop())
        self.append(cls.__new__(cls, *args))

    def load_newobj_ex(self):
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self._callable(self.stack.pop())
        self.append(cls.__new__(cls, *args, **kwargs))

    def load_build(self):
        inst = self.stack[-2]  # under the state
        if isinstance(inst, type) or not isinstance(inst, _allowed().classes):
            raise RefusedGlobal(f'the checkpoint sets the state of {type(inst).__name__} '
                                f'object {inst!r:.80}, which is not an instance of an '
                                'allowed class')
        super().load_build()

    def load_inst(self):
        raise RefusedGlobal('the checkpoint uses the INST opcode (protocol 0 instances)')

    def load_obj(self):
        raise RefusedGlobal('the checkpoint uses the OBJ opcode (protocol 0 instances)')

    dispatch = dict(pickle._Unpickler.dispatch)
    dispatch[pickle.REDUCE[0]] = load_reduce
    dispatch[pickle.NEWOBJ[0]] = load_newobj
    dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex
    dispatch[pickle.BUILD[0]] = load_build
    dispatch[pickle.INST[0]] = load_inst
    dispatch[pickle.OBJ[0]] = load_obj


def load(file, **kwargs):
    """``pickle.load`` with :class:`Unpickler` (torch reads its legacy format's headers
    with it)."""
    return Unpickler(file, **kwargs).load()
