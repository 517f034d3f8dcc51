"""Which entries of a checkpoint are the backbone's, and loading them loudly.

:func:`extract_state_dict` finds the weights in the formats users bring (timm, official
XCiT / SimA, mmengine detectors / segmentors, plain state dicts); :func:`load_pretrained`
loads them into a model, fails with a message that names expected and found keys (and a
prefix or nesting that would explain a mismatch), and logs what was loaded, ignored and
left initialized (:func:`summarize_keys`). The file itself is read through mmengine's
``CheckpointLoader``, which ``import mmsoft`` routes through :func:`mmsoft.checkpoint.load`
(``weights_only`` kept on).
"""
import logging
import re

from mmengine.logging import MMLogger, print_log
from mmengine.runner.checkpoint import CheckpointLoader

__all__ = ['STATE_DICT_ENTRIES', 'COMMON_PREFIXES', 'extract_state_dict', 'summarize_keys',
           'load_pretrained']

# Where the weights sit in the checkpoint formats users bring, in order of preference:
# timm training checkpoints (``state_dict_ema`` is what evaluation uses), mmengine,
# official XCiT / SimA files.
STATE_DICT_ENTRIES = ('state_dict_ema', 'state_dict', 'model')
# Prefixes that ``prefix=`` is suggested for when a checkpoint matches nothing.
COMMON_PREFIXES = ('module.', 'backbone.', 'model.', 'encoder.', 'student.', 'teacher.')


def _unwrap(checkpoint):
    """(state dict, name of the entry it came from or None)."""
    if isinstance(checkpoint, dict):
        for key in STATE_DICT_ENTRIES:
            if isinstance(checkpoint.get(key), dict):
                return checkpoint[key], key
    if not isinstance(checkpoint, dict):
        raise ValueError(f'checkpoint holds no state dict (got {type(checkpoint).__name__})')
    return checkpoint, None


def _strip_module(key):
    return key[len('module.'):] if key.startswith('module.') else key


def _select(state, prefix=None):
    """(the backbone's entries, the prefix used, the keys left outside it)."""
    state = {_strip_module(k): v for k, v in state.items()}
    if prefix is None and any(k.startswith('backbone.') for k in state):
        prefix = 'backbone.'
    if not prefix:
        return state, None, []
    prefix = _strip_module(prefix)
    prefix = prefix if prefix.endswith('.') else prefix + '.'
    inside = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    return inside, prefix, [k for k in state if not k.startswith(prefix)]


def extract_state_dict(checkpoint, prefix=None):
    """The backbone weights of a checkpoint in any of the formats users bring.

    - timm training checkpoints: ``state_dict_ema`` (what evaluation uses), else
      ``state_dict``;
    - official XCiT / SimA files: ``{'model': ...}``;
    - mmengine checkpoints of whole detectors / segmentors: keys under ``backbone.``;
    - plain state dicts. A ``module.`` prefix (DataParallel) is removed, then ``prefix``
      (when given) selects and strips the entries under it.
    """
    return _select(_unwrap(checkpoint)[0], prefix)[0]


def _examples(keys, n=4):
    """Up to n keys spread over ``keys`` (first, last and between), in their order."""
    keys = list(keys)
    if len(keys) <= n:
        return keys
    return [keys[round(i * (len(keys) - 1) / (n - 1))] for i in range(n)]


def _index_ranges(ids):
    """[0, 1, 2, 5] -> '{0-2,5}'; [3] -> '3'."""
    ids, parts = sorted(ids), []
    for i in ids:
        if parts and i == parts[-1][1] + 1:
            parts[-1][1] = i
        else:
            parts.append([i, i])
    text = ','.join(str(a) if a == b else f'{a}-{b}' for a, b in parts)
    return text if len(ids) == 1 else '{' + text + '}'


def summarize_keys(keys, all_keys=()):
    """A short description of ``keys``, a subset of the state dict ``all_keys``: a whole
    top-level module as ``'head.*'``, whole numbered blocks as ``'blocks.{8-11}.*'``, the
    rest with their indices starred (``'blocks.*.attn.temperature'``)."""
    keys = set(keys)
    # BatchNorm fills in a missing num_batches_tracked itself: never reported missing.
    universe = {k for k in all_keys if not k.endswith('num_batches_tracked')} | keys

    def under(prefix):
        return {k for k in universe if k == prefix or k.startswith(prefix + '.')}

    out, rest = [], set(keys)
    for top in sorted({k.split('.')[0] for k in keys}):
        if under(top) <= keys:
            out.append(top if under(top) == {top} else top + '.*')
            rest -= under(top)
    blocks = {}
    for k in sorted(rest):
        parts = k.split('.')
        if len(parts) > 2 and parts[1].isdigit() and under('.'.join(parts[:2])) <= rest:
            blocks.setdefault(parts[0], set()).add(int(parts[1]))
    for top, ids in sorted(blocks.items()):
        out.append(f'{top}.{_index_ranges(ids)}.*')
        rest -= {k for i in ids for k in under(f'{top}.{i}')}
    out += sorted({re.sub(r'(?<=\.)\d+(?=\.|$)', '*', k) for k in rest})
    return out


def _guess_prefix(found, expected):
    """The prefix that, stripped from the found keys, gives expected keys; else None."""
    counts = {}
    for k in found:
        parts = k.split('.')
        for j in range(1, min(4, len(parts))):
            if '.'.join(parts[j:]) in expected:
                p = '.'.join(parts[:j]) + '.'
                counts[p] = counts.get(p, 0) + 1
                break
    return max(counts, key=counts.get) if counts else None


def _no_match_message(model, path, raw_keys, state, prefix, source):
    """Why a checkpoint fits none of ``model``'s parameters, and what would fix it."""
    name = type(model).__name__
    expected = [k for k, _ in model.named_parameters()]
    where = f" (entry '{source}')" if source else ''
    msg = (f'{name}: checkpoint {path}{where} matches none of the model\'s '
           f'{len(expected)} parameters')
    nested = sorted(k for k, v in state.items() if isinstance(v, dict))
    guess = _guess_prefix(raw_keys, set(expected))
    if nested:
        msg += (f'. Its state dict nests further dicts under {nested[:4]}: the weights are '
                f'probably one level down')
    elif guess is not None:
        msg += (f". Its keys carry the prefix '{guess}' (e.g. "
                f"'{next(k for k in raw_keys if k.startswith(guess))}'): pass "
                f"init_cfg=dict(type='Pretrained', checkpoint=..., prefix='{guess}')")
    elif prefix:
        msg += f" under the prefix '{prefix}'"
    common = sorted({p for p in COMMON_PREFIXES for k in raw_keys if k.startswith(p)})
    if common and guess is None:
        msg += f'. Its keys start with {common}'
    return (f'{msg}. Expected keys like {_examples(expected)}; found keys like '
            f'{_examples(raw_keys)}')


def load_pretrained(model, path, filter_fn=None, prefix=None, logger='current',
                    min_fraction=0.5):
    """Load ``path`` into ``model`` through ``filter_fn(state_dict)``.

    Fails (ValueError) when the checkpoint fits none of the model's parameters (naming
    expected and found keys, and a prefix or nesting that would explain it), when a shape
    differs (naming the first mismatching parameter) and when less than ``min_fraction``
    of the model's parameter elements would be loaded. One INFO line says what was loaded,
    which checkpoint keys were ignored (classification head, ...) and which parameters
    the checkpoint did not hold. Loading keeps torch's ``weights_only`` protection (see
    ``mmsoft.checkpoint``).
    """
    name = type(model).__name__
    log = MMLogger.get_current_instance() if logger == 'current' else logger
    checkpoint = CheckpointLoader.load_checkpoint(path, map_location='cpu', logger=logger)
    raw, source = _unwrap(checkpoint)
    state, used_prefix, outside = _select(raw, prefix)
    own = model.state_dict()
    params = dict(model.named_parameters())
    if not any(k in params for k in state):
        raise ValueError(_no_match_message(model, path, list(raw), raw, used_prefix,
                                           source))
    kept = filter_fn(state) if filter_fn is not None else state
    for k, v in kept.items():
        if k in own and tuple(own[k].shape) != tuple(v.shape):
            raise ValueError(f'{name}: checkpoint {path} does not match the arch: '
                             f'parameter {k} has shape {tuple(v.shape)} in the checkpoint '
                             f'but {tuple(own[k].shape)} in the model')
    total = sum(p.numel() for p in params.values())
    loaded = sum(p.numel() for k, p in params.items() if k in kept)
    if loaded < min_fraction * total:
        missing = [k for k in own if k not in kept]
        raise ValueError(f'{name}: checkpoint {path} holds only {loaded / total:.0%} of the '
                         f"model's parameter values (at least {min_fraction:.0%} expected); "
                         f'missing: {summarize_keys(missing, own)}; the checkpoint has keys '
                         f'like {_examples(state)}')
    missing, unexpected = model.load_state_dict(kept, strict=False)
    used = set(kept) - set(unexpected)
    ignored = [k for k in state if k not in used]
    summary = [(used_prefix or '') + p for p in summarize_keys(ignored, state)]
    summary += summarize_keys(outside, outside)
    where = f" ('{source}')" if source else ''
    print_log(f'{name}: loaded {len(used)} of {len(state) + len(outside)} tensors from '
              f'{path}{where}; ignored checkpoint keys: {summary or "none"}; not in the '
              f'checkpoint (initialized): {summarize_keys(missing, own) or "none"}',
              logger=log, level=logging.INFO)
    return missing, [(used_prefix or '') + k for k in ignored] + outside
