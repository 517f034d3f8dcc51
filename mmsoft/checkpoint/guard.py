"""How ``import mmsoft`` routes mmengine's checkpoint loading through mmsoft's :func:`load`.

Two hooks, on both stacks (OpenMMLab's mmengine and onedl-mmengine):

1. **mmengine's schemes are mmsoft's.** ``CheckpointLoader.register_scheme(..., force=True)``,
   mmengine's extension point, replaces the loader of each scheme mmengine registers
   (local paths, ``http(s)://``, ``pavi://``, ``s3://`` / ``petrel://``,
   ``torchvision://`` / ``modelzoo://``, ``open-mmlab://`` / ``openmmlab://``,
   ``mmcls://``) with one below that reads the file with ``weights_only`` itself. Every
   entry point of mmengine and the OpenMMLab codebases dispatches through that table:
   ``init_cfg=dict(type='Pretrained')``, ``load_from``, ``resume``, ``Runner`` and
   ``mmengine.runner.load_checkpoint``, ``CheckpointLoader.load_checkpoint``. mmengine's
   own readers, and with them onedl-mmengine's retry with ``weights_only=False``, are not
   reached that way. A user trusts a remote file (``mmsoft.checkpoint.trust``) by the name
   it is loaded with, also for ``pavi://`` and ``s3://`` names.

2. **What bypasses the table** (:func:`guard_mmengine_functions`). mmengine's loader
   functions stay public names of ``mmengine.runner.checkpoint`` (``load_from_local``,
   ``load_from_http``, ...), and code calls them by name, where no registered scheme is
   asked: mmengine's own ``load_from_torchvision`` / ``load_from_openmmlab`` /
   ``load_from_mmcls`` call ``load_from_http`` that way, and so does a codebase's own
   scheme built on them. They read through the module's ``torch.load`` (onedl-mmengine
   retrying a refused file with ``weights_only=False``) and ``load_url`` (torch.hub's,
   which unpickles in full by default). register_scheme cannot reach these calls and
   mmengine offers no other hook, so the module's ``torch`` is a stand-in whose ``load`` is
   mmsoft's (and whose ``serialization.safe_globals``, with which onedl-mmengine would add
   ``builtins.getattr`` to torch's allow-list of the whole process, adds nothing), and its
   ``load_url`` is wrapped.
"""
import contextlib
import functools
import io
import os
import os.path as osp
import sys
import types
import zipfile
from collections import OrderedDict
from tempfile import TemporaryDirectory
from urllib.parse import urlparse

import torch

from .safe_load import (UntrustedCheckpointError, _refuse_unless_trusted,
                        _warn_full_unpickling, _weights_only_first, load, protection)

__all__ = ['guard_mmengine', 'guard_mmengine_functions', 'SCHEMES', 'load_from_local',
           'load_from_http', 'load_from_pavi', 'load_from_ceph', 'load_from_torchvision',
           'load_from_openmmlab', 'load_from_mmcls']


def _mmengine_checkpoint():
    from mmengine.runner import checkpoint
    return checkpoint


def _warn(message):
    from mmengine.logging import print_log
    print_log(message, logger='current', level=30)


# ---------------------------------------------------------------- the schemes' loaders
def load_from_local(filename, map_location=None):
    """A local checkpoint file (``~`` expanded), read by :func:`load`."""
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        hint = ''
        if osp.basename(osp.dirname(osp.abspath(filename))) == 'checkpoints':
            # where the shipped configs look for the official ImageNet weights
            hint = (' mmsoft ships no weights: the configs expect the official ImageNet '
                    'weights in checkpoints/ (how to get them: docs/en/faq.md, "where are '
                    'the weights?"), or set model.backbone.init_cfg.checkpoint.')
        raise FileNotFoundError(f'{filename} can not be found.{hint}')
    return load(filename, map_location=map_location)


def _hub_file(url, model_dir=None, progress=True, check_hash=False, file_name=None):
    """Where torch.hub keeps ``url`` (``<hub dir>/checkpoints`` unless ``model_dir``),
    downloaded there first if it is not. A hub file that is a zip archive of one file (the
    legacy hub format) is extracted beside it and that file returned."""
    model_dir = model_dir or osp.join(torch.hub.get_dir(), 'checkpoints')
    os.makedirs(model_dir, exist_ok=True)
    file_name = file_name or osp.basename(urlparse(url).path)
    cached = osp.join(model_dir, file_name)
    if not osp.exists(cached):
        hash_prefix = None
        if check_hash:
            match = torch.hub.HASH_REGEX.search(file_name)
            hash_prefix = match.group(1) if match else None
        torch.hub.download_url_to_file(url, cached, hash_prefix, progress=progress)
    if zipfile.is_zipfile(cached):
        with zipfile.ZipFile(cached) as archive:
            members = archive.infolist()
            if len(members) == 1 and not members[0].is_dir():
                archive.extract(members[0], model_dir)
                return osp.join(model_dir, members[0].filename)
    return cached


def _load_url(url, model_dir=None, map_location=None, progress=True, check_hash=False,
              file_name=None):
    """torch.hub's ``load_state_dict_from_url``, read by :func:`load`'s rules (trusted by
    the URL): torch.hub's loader cannot take mmsoft's restricted unpickler."""
    cached = _hub_file(url, model_dir, progress, check_hash, file_name)
    return _weights_only_first(url, lambda protected: torch.load(
        cached, map_location=map_location, **protection(protected)))


def load_from_http(filename, map_location=None, model_dir=None, progress=None):
    """A checkpoint URL, downloaded into torch.hub's cache (``model_dir`` by default) and
    read with ``weights_only``; trusted by its URL. Distributed, rank 0 downloads first
    and the other ranks read its copy after a barrier. ``progress`` defaults to whether
    stdin is a terminal."""
    from mmengine.dist import get_dist_info
    if progress is None:
        progress = os.isatty(0)
    rank, world_size = get_dist_info()
    checkpoint = None
    if rank == 0:
        checkpoint = _load_url(filename, model_dir, map_location, progress)
    if world_size > 1:
        torch.distributed.barrier()
        if rank > 0:
            checkpoint = _load_url(filename, model_dir, map_location, progress)
    return checkpoint


def load_from_pavi(filename, map_location=None):
    """A ``pavi://`` model, downloaded from pavi's modelcloud into a temporary folder and
    read with ``weights_only``; trusted by its ``pavi://`` name."""
    try:
        from pavi import modelcloud
    except ImportError:
        raise ImportError('Please install pavi to load checkpoint from modelcloud.')
    model = modelcloud.get(filename[len('pavi://'):])
    with TemporaryDirectory() as tmp_dir:
        downloaded = osp.join(tmp_dir, model.name)
        model.download(downloaded)
        return _weights_only_first(filename, lambda protected: torch.load(
            downloaded, map_location=map_location, **protection(protected)))


def load_from_ceph(filename, map_location=None, backend='petrel'):
    """An ``s3://`` or ``petrel://`` object (optionally ``name:`` before the scheme), read
    into memory by mmengine's file backend ``backend`` and then with ``weights_only``;
    trusted by its name."""
    from mmengine.fileio import get_file_backend
    data = get_file_backend(filename, backend_args={'backend': backend}).get(filename)
    return _weights_only_first(filename, lambda protected: torch.load(
        io.BytesIO(data), map_location=map_location, **protection(protected)))


def load_from_torchvision(filename, map_location=None):
    """``torchvision://NAME`` (or the deprecated ``modelzoo://NAME``): the URL mmengine's
    ``get_torchvision_models()`` gives for NAME, through :func:`load_from_http`."""
    scheme, name = filename.split('://', 1)
    if scheme == 'modelzoo':
        _warn('The URL scheme of "modelzoo://" is deprecated, please use "torchvision://" '
              'instead')
    url = _mmengine_checkpoint().get_torchvision_models()[name]
    return load_from_http(url, map_location=map_location)


def _mmengine_home():
    """mmengine's cache folder, where ``open-mmlab://`` names that are not URLs live."""
    checkpoint = _mmengine_checkpoint()
    default = osp.join(os.getenv(checkpoint.ENV_XDG_CACHE_HOME, checkpoint.DEFAULT_CACHE_DIR),
                       'mmengine')
    return osp.expanduser(os.getenv(checkpoint.ENV_MMENGINE_HOME, default))


def load_from_openmmlab(filename, map_location=None):
    """``open-mmlab://NAME`` (or ``openmmlab://NAME``): a deprecated NAME is renamed as
    mmengine's ``get_deprecated_model_names()`` says, then mmengine's
    ``get_external_models()`` (its table and ``$MMENGINE_HOME/open_mmlab.json``) gives a URL,
    read by :func:`load_from_http`, or a path relative to mmengine's cache folder, read by
    :func:`load_from_local`."""
    checkpoint = _mmengine_checkpoint()
    scheme, name = filename.split('://', 1)
    renamed = checkpoint.get_deprecated_model_names()
    if name in renamed:
        _warn(f'{scheme}://{name} is deprecated in favor of {scheme}://{renamed[name]}')
        name = renamed[name]
    location = checkpoint.get_external_models()[name]
    if location.startswith(('http://', 'https://')):
        return load_from_http(location, map_location=map_location)
    return load_from_local(osp.join(_mmengine_home(), location), map_location=map_location)


def load_from_mmcls(filename, map_location=None):
    """``mmcls://NAME``: the URL mmengine's ``get_mmcls_models()`` gives for NAME, through
    :func:`load_from_http`; returns ``{'state_dict': ...}`` with the classifier's
    ``backbone.*`` weights, the prefix removed, and nothing else."""
    url = _mmengine_checkpoint().get_mmcls_models()[filename[len('mmcls://'):]]
    loaded = load_from_http(url, map_location=map_location)
    state_dict = loaded.get('state_dict', loaded)
    prefix = 'backbone.'
    return dict(state_dict=OrderedDict(
        (key[len(prefix):], value) for key, value in state_dict.items()
        if key.startswith(prefix)))


# The schemes mmengine registers (same prefixes, which are regular expressions), each with
# mmsoft's loader.
SCHEMES = (
    ('', load_from_local),
    (('http://', 'https://'), load_from_http),
    ('pavi://', load_from_pavi),
    ((r'(\S+\:)?s3://', r'(\S+\:)?petrel://'), load_from_ceph),
    (('modelzoo://', 'torchvision://'), load_from_torchvision),
    (('open-mmlab://', 'openmmlab://'), load_from_openmmlab),
    ('mmcls://', load_from_mmcls),
)


# ------------------------------------------- mmengine's loader functions called by name
def _handled_refusal(f):
    """The :class:`UntrustedCheckpointError` for ``f`` that the calling code is handling
    right now (in this thread), if any: onedl-mmengine retries inside its ``except``."""
    err = sys.exc_info()[1]
    while err is not None and not isinstance(err, UntrustedCheckpointError):
        err = err.__context__
    return err if err is not None and err.source is f else None


def _mmengine_torch_load(f, *args, **kwargs):
    """``torch.load`` as ``mmengine.runner.checkpoint`` sees it once mmsoft is imported:
    :func:`load`, and ``weights_only=False`` only for a trusted file."""
    if kwargs.get('weights_only') is False:  # onedl-mmengine's retry, or any caller
        refused = _handled_refusal(f)
        _refuse_unless_trusted(f, refused.reason if refused is not None else None)
        _warn_full_unpickling(f)
        return torch.load(f, *args, **kwargs)
    kwargs.pop('weights_only', None)
    if args:  # torch.load(f, map_location, pickle_module)
        kwargs.setdefault('map_location', args[0])
        if len(args) > 1 and args[1] is not None:
            raise TypeError('mmsoft: torch.load with a pickle_module cannot keep weights_only')
    return load(f, **kwargs)


def _mmengine_load_url(original, url, model_dir=None, map_location=None, progress=True,
                       check_hash=False, file_name=None, weights_only=None):
    """mmengine's ``load_url`` (torch.hub's, whose default is ``weights_only=False``),
    downloading as it does and reading by :func:`load`'s rules (:func:`_load_url`);
    ``weights_only=False`` only for a trusted URL."""
    if weights_only is False:
        _refuse_unless_trusted(url)
        _warn_full_unpickling(url)
        return original(url, model_dir=model_dir, map_location=map_location,
                        progress=progress, check_hash=check_hash, file_name=file_name,
                        weights_only=False)
    return _load_url(url, model_dir, map_location, progress, check_hash, file_name)


@contextlib.contextmanager
def _allow_nothing_more(entries):
    """``torch.serialization.safe_globals`` as ``mmengine.runner.checkpoint`` sees it:
    adds nothing to torch's allow-list. onedl-mmengine wraps its reads in
    ``safe_globals([getattr, ...])``; torch's allow-list is one for the whole process, so a
    crafted file read at the same time in another thread would get ``builtins.getattr``
    and chain it to ``eval``. The module's ``torch.load`` is mmsoft's :func:`load`, which
    allows what mmengine's checkpoints need itself."""
    yield


class _StandIn(types.ModuleType):
    """Stands in for a module inside one mmengine module: the attributes given are
    mmsoft's, every other attribute is the real module's."""

    def __init__(self, real, **overrides):
        super().__init__(real.__name__, real.__doc__)
        self.__dict__['_mmsoft_real_module'] = real
        self.__dict__.update(overrides)

    def __getattr__(self, name):
        return getattr(self.__dict__['_mmsoft_real_module'], name)

    def __dir__(self):
        return sorted(set(dir(self.__dict__['_mmsoft_real_module'])) | set(self.__dict__))


def guard_mmengine_functions():
    """Make mmengine's loader functions, called by name rather than through
    ``CheckpointLoader``, read through :func:`load`: ``mmengine.runner.checkpoint.torch``
    becomes a stand-in whose ``load`` is mmsoft's (and whose
    ``serialization.safe_globals`` adds nothing to torch's process-wide allow-list), and
    its ``load_url`` reads with ``weights_only`` first. Idempotent."""
    module = _mmengine_checkpoint()
    if not isinstance(module.torch, _StandIn):
        real = module.torch
        module.torch = _StandIn(real, load=_mmengine_torch_load, serialization=_StandIn(
            real.serialization, safe_globals=_allow_nothing_more))
    load_url = getattr(module, 'load_url', None)
    if load_url is not None and not getattr(load_url, '_mmsoft_guarded', False):
        guarded = functools.wraps(load_url)(functools.partial(_mmengine_load_url, load_url))
        guarded._mmsoft_guarded = True
        module.load_url = guarded


def guard_mmengine():
    """Route mmengine's checkpoint loading through :func:`load`: register mmsoft's loader
    for every scheme of ``CheckpointLoader`` (:data:`SCHEMES`) and guard mmengine's loader
    functions called by name (:func:`guard_mmengine_functions`). The same on every torch
    (on torch < 2.5 :func:`load` reads with mmsoft's restricted unpickler). Idempotent."""
    from mmengine.runner import CheckpointLoader
    for prefixes, loader in SCHEMES:
        CheckpointLoader.register_scheme(prefixes, loader, force=True)
    guard_mmengine_functions()
