"""What mmsoft lets a checkpoint reference beyond torch's own ``weights_only`` list: the
entries mmengine's and timm's checkpoints need (:func:`mmengine_checkpoint_globals`),
and ``builtins.getattr`` resolved to :func:`history_buffer_statistic`. Both of mmsoft's
protected reads use it: torch's allow-list (:mod:`mmsoft.checkpoint.safe_load`) and, on
torch < 2.5, the restricted unpickler (:mod:`mmsoft.checkpoint.restricted_pickle`)."""
import argparse
import pickle

import numpy as np

__all__ = ['HISTORY_BUFFER_STATISTICS', 'history_buffer_statistic',
           'mmengine_checkpoint_globals']

HISTORY_BUFFER_STATISTICS = ('min', 'max', 'current', 'mean')
_GETATTR_NAME = 'builtins.getattr'


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
