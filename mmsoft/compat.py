"""Known conflicts with packages that share an environment with OpenMMLab.

Standard library only: ``tools/misc/check_env.py`` loads this file even where mmsoft itself
cannot be imported.
"""
import warnings
from importlib import metadata

__all__ = [
    'installed_version', 'onedl_config_scopes', 'transformers_trap', 'warn_known_conflicts'
]


def installed_version(*names):
    """Version of the first installed distribution among ``names``, else None."""
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _numbers(version, n=2):
    out = []
    for part in version.split('.')[:n]:
        digits = ''.join(c for c in part if c.isdigit())
        out.append(int(digits) if digits else 0)
    return out


def transformers_trap(transformers=None, mmpretrain=None):
    """The explanation and fix, if mmpretrain's multimodal models break mmdet here; None
    otherwise. Versions default to what is installed.

    mmpretrain 1.2.0 (and older, and onedl-mmpretrain 1.3.6) imports its multimodal models
    when transformers >= 4.28 is installed. With transformers >= 5 that import fails,
    mmpretrain sets the missing base class to None and subclasses it: ``TypeError:
    NoneType takes no arguments``. mmdet imports mmpretrain whenever it is installed, so
    every detector config fails.
    """
    transformers = transformers or installed_version('transformers')
    mmpretrain = mmpretrain or installed_version('mmpretrain', 'onedl-mmpretrain')
    if not transformers or not mmpretrain or _numbers(transformers, 1)[0] < 5:
        return None
    if _numbers(mmpretrain) > [1, 3]:
        return None  # not known to be affected (1.2.0 and onedl's 1.3.6 are: tested)
    return (f'transformers {transformers} is installed beside mmpretrain {mmpretrain}, '
            'whose multimodal models need transformers < 5: importing mmdet.models (and '
            'mmpretrain.models) then fails with "TypeError: NoneType takes no arguments". '
            'Fix: pip install "transformers<5" (or pip uninstall mmpretrain if you do not '
            'use it).')


def warn_known_conflicts():
    """Warn once at import time about a conflict that would fail later, cryptically."""
    trap = transformers_trap()
    if trap:
        warnings.warn('mmsoft: ' + trap, RuntimeWarning, stacklevel=3)


# mmengine resolves ``mmseg::x.py`` through the *distribution* named in its MODULE2PACKAGE
# table ('mmsegmentation'); the OneDL continuation renamed the distributions
# (onedl-mmsegmentation, ...), so onedl-mmengine 0.10.12 reports "mmsegmentation is not
# installed" for every mmseg:: base config. mmdet and mmpretrain resolve through their
# module names and are not affected. mmengine offers no extension point for this: the
# table is a plain module-level dict that its config loading reads and asserts on, with
# no registration API, so the entries are corrected in place, only where the OpenMMLab
# distribution is missing and the OneDL one is installed.
_ONEDL_DISTRIBUTIONS = {'mmdet': 'onedl-mmdetection', 'mmseg': 'onedl-mmsegmentation',
                        'mmpretrain': 'onedl-mmpretrain'}


def onedl_config_scopes():
    """Point mmengine's ``scope::`` config lookup at the OneDL distributions where only
    those are installed. Returns the scopes changed (for the log and tests)."""
    import importlib.util
    try:
        from mmengine.config import utils as config_utils
    except ImportError:
        return []
    table = getattr(config_utils, 'MODULE2PACKAGE', None)
    if table is None:
        return []
    changed = []
    for scope, onedl in _ONEDL_DISTRIBUTIONS.items():
        dist = table.get(scope)
        if dist is None or installed_version(dist) or installed_version(onedl) is None:
            continue
        if dist.replace('-', '_') == scope and importlib.util.find_spec(scope) is not None:
            continue  # resolved through the module name
        table[scope] = onedl
        changed.append(scope)
    return changed
