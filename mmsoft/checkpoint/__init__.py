"""Checkpoint handling of mmsoft, in one place.

- :mod:`mmsoft.checkpoint.safe_load`: reading checkpoint files with torch's ``weights_only``
  protection kept on (:func:`load`, the allow-list :func:`safe_globals`, on torch < 2.5 the
  restricted unpickler of :mod:`mmsoft.checkpoint.restricted_pickle`, :func:`trust` /
  ``MMSOFT_TRUSTED_CHECKPOINTS``, :class:`UntrustedCheckpointError`).
- :mod:`mmsoft.checkpoint.guard`: :func:`guard_mmengine`, which routes mmengine's checkpoint
  loading through :func:`load` (mmsoft's loader for each scheme of mmengine's
  ``CheckpointLoader``, and mmengine's loader functions called by name).
- :mod:`mmsoft.checkpoint.keys`: which entries of a checkpoint are the backbone's
  (:func:`extract_state_dict`) and loading them into a model with a loud report of what
  matched, was ignored or stayed initialized (:func:`load_pretrained`,
  :func:`summarize_keys`).

Every name is importable from ``mmsoft.checkpoint``; the module state (trusted paths,
allow-list lock) lives in :mod:`mmsoft.checkpoint.safe_load` only. This package does not
import ``mmsoft.models``.
"""
from .guard import guard_mmengine, guard_mmengine_functions
from .keys import (COMMON_PREFIXES, STATE_DICT_ENTRIES, extract_state_dict, load_pretrained,
                   summarize_keys)
from .safe_load import (ALLOW_LIST, HISTORY_BUFFER_STATISTICS, TRUSTED_ENV,
                        UntrustedCheckpointError, history_buffer_statistic,
                        history_buffer_table_kept, is_trusted, load,
                        mmengine_checkpoint_globals, protection, safe_globals, trust)

__all__ = ['ALLOW_LIST', 'TRUSTED_ENV', 'UntrustedCheckpointError', 'history_buffer_statistic',
           'mmengine_checkpoint_globals', 'safe_globals', 'trust', 'is_trusted', 'load',
           'protection', 'history_buffer_table_kept',
           'guard_mmengine', 'guard_mmengine_functions', 'HISTORY_BUFFER_STATISTICS',
           'STATE_DICT_ENTRIES', 'COMMON_PREFIXES', 'extract_state_dict', 'summarize_keys',
           'load_pretrained']
