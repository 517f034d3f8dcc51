"""Building a model and feeding it: what the tools share with users.

    ``init_backbone``      a SOFT / XCiT-SimA backbone from an arch name or a config,
                           optionally with weights (any format the backbones load)
    ``init_model``         a config's whole detector / segmentor / classifier
    ``resolve_checkpoint`` a checkpoint file, or a work dir's last checkpoint
    ``load_image`` / ``to_tensor`` / ``dataset_images``  images as the models take them
"""
import glob
import importlib
import logging
import os.path as osp
import threading
from contextlib import contextmanager

import numpy as np
import torch

__all__ = [
    'IMAGE_EXTS', 'SAMPLES', 'dataset_images', 'default_images', 'describe',
    'init_backbone', 'init_model', 'load_image', 'resolve_checkpoint', 'to_tensor'
]

IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)
IMAGE_EXTS = ('.jpg', '.jpeg', '.png', '.bmp', '.webp', '.tif', '.tiff')

# The scikit-image samples --image accepts, with what they show. A fixed list: any other
# attribute of skimage.data is a function too (``download_all`` starts a download).
SAMPLES = {
    'astronaut': 'a photo of a person (astronaut Eileen Collins)',
    'camera': 'a photo of a person with a camera (grayscale)',
    'cat': 'a photo of a cat (the same image as chelsea)',
    'chelsea': 'a photo of a cat',
    'coffee': 'a photo of a cup of coffee',
    'coins': 'a photo of coins (grayscale)',
    'moon': 'a photo of the moon\'s surface (grayscale)',
    'rocket': 'a photo of a rocket on its launch pad',
    'hubble_deep_field': 'a telescope image of galaxies',
    'immunohistochemistry': 'a microscope image of stained tissue',
}


class _BelowLevelInThread(logging.Filter):
    """Drops the records below ``level`` logged by the thread that made the filter."""

    def __init__(self, level):
        super().__init__()
        self.level = level
        self.thread = threading.get_ident()

    def filter(self, record):
        # record.thread is None where logging.logThreads is off: then no thread is exempt
        return record.levelno >= self.level or record.thread not in (self.thread, None)


def _as_level(log_level):
    """A level number from a name ('INFO', 'warning') or a number (``logging.INFO``)."""
    level = log_level
    if isinstance(level, str):
        level = logging.getLevelName(level.upper())  # the number for a known name
    if isinstance(level, bool) or not isinstance(level, int):
        raise ValueError(f'log_level must be a logging level such as \'WARNING\' or '
                         f'logging.INFO, got {log_level!r}')
    return level


@contextmanager
def _mmengine_log_level(log_level):
    """While the block runs, mmengine's current logger drops what this thread logs below
    ``log_level``; other threads, and everything after the block, log as before (nothing
    of the logger's own configuration changes: a filter is added and removed)."""
    from mmengine.logging import MMLogger
    quiet = _BelowLevelInThread(_as_level(log_level))
    logger = MMLogger.get_current_instance()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def init_backbone(backbone=None, config=None, checkpoint=None, log_level='WARNING'):
    """A backbone in eval mode from ``'SOFT:small'`` / ``'XCiTSimA:s12'`` or from a
    config's ``model.backbone``, optionally loading ``checkpoint`` (any format the
    backbones load: official, mmengine whole-model, converted; a work dir: its last
    checkpoint).

    mmengine's messages below ``log_level`` (a name such as ``'INFO'`` or a
    ``logging`` level) are not shown while it runs; ``log_level='INFO'`` shows the line
    that says which checkpoint keys were loaded and ignored. Warnings and errors show
    either way."""
    with _mmengine_log_level(log_level):
        return _init_backbone(backbone, config, checkpoint)


def _init_backbone(backbone, config, checkpoint):
    from mmengine.config import Config

    from ..models.utils import Backbone
    from ..registry import MODELS
    if config is not None:
        cfg = dict(Config.fromfile(config).model.backbone)
        name = cfg.pop('type')
        cfg.pop('init_cfg', None)
        if cfg.get('norm_cfg', {}).get('type') == 'SyncBN':
            cfg['norm_cfg'] = dict(cfg['norm_cfg'], type='BN')
    else:
        name, _, arch = (backbone or 'SOFT:small').partition(':')
        cfg = dict(arch=arch) if arch else {}  # no arch: the family's default
    cls = MODELS.get(name) if isinstance(name, str) else None
    if not (isinstance(cls, type) and issubclass(cls, Backbone)):
        families = sorted(n for n, c in MODELS.module_dict.items()
                          if isinstance(c, type) and issubclass(c, Backbone))
        if config is not None:
            raise ValueError(f'the backbone of {config} is {name!r}, not an mmsoft '
                             f'backbone ({", ".join(families)})')
        raise ValueError(f'backbone must be FAMILY:ARCH with FAMILY one of {families}, got '
                         f'{backbone!r}')
    cfg['drop_path_rate'] = 0.
    if checkpoint:
        if osp.isdir(checkpoint):
            checkpoint = resolve_checkpoint(checkpoint)
        cfg['init_cfg'] = dict(type='Pretrained', checkpoint=checkpoint)
    model = cls(**cfg)
    model.init_weights()
    return model.eval()


def init_model(cfg, checkpoint=None, log_level='WARNING'):
    """The detector / segmentor / classifier of a config (path or ``Config``), built as
    mmengine's Runner does (codebase scope, top-level ``data_preprocessor``), without the
    backbone's ImageNet checkpoint, with SyncBN reverted to BN, after ``init_weights()``;
    then ``checkpoint`` loaded, if given (a file, a URL, or a work dir: its last
    checkpoint).
    In train mode, like a freshly built model; call ``.eval()`` for inference.

    mmengine's messages below ``log_level`` (a name such as ``'INFO'`` or a ``logging``
    level) are not shown while it runs: at INFO, ``init_weights()`` reports how every
    parameter was initialized (hundreds of lines), and the loading reports the file.
    Warnings (a checkpoint's missing or unexpected keys) and errors show either way; the
    logger is left as it was."""
    import mmsoft  # noqa: F401  (registers the backbones, guards checkpoint loading)
    with _mmengine_log_level(log_level):
        return _init_model(cfg, checkpoint)


def _init_model(cfg, checkpoint):
    from mmengine.config import Config
    from mmengine.model import revert_sync_batchnorm
    from mmengine.registry import init_default_scope
    if not isinstance(cfg, Config):
        cfg = Config.fromfile(cfg)
    init_default_scope(cfg.default_scope)
    cfg.model.backbone.pop('init_cfg', None)
    if 'data_preprocessor' in cfg:
        cfg.model.setdefault('data_preprocessor', cfg.data_preprocessor)
    registry = importlib.import_module(cfg.default_scope + '.registry').MODELS
    model = revert_sync_batchnorm(registry.build(cfg.model))
    model.init_weights()
    if checkpoint:
        from mmengine.runner import load_checkpoint
        if osp.isdir(checkpoint):
            checkpoint = resolve_checkpoint(checkpoint)
        load_checkpoint(model, checkpoint, map_location='cpu', logger='current')
    return model


def resolve_checkpoint(path):
    """A checkpoint file from ``path``: the file itself, or a work dir's last checkpoint
    (the file named by its ``last_checkpoint``, as tools/train.py writes it)."""
    if path is None or not osp.isdir(path):
        if path is not None and not osp.isfile(path):
            raise FileNotFoundError(f'no such checkpoint: {path}')
        return path
    marker = osp.join(path, 'last_checkpoint')
    if not osp.isfile(marker):
        raise FileNotFoundError(f'{path} is a directory without a last_checkpoint file; '
                                'give the .pth file')
    with open(marker) as f:
        named = f.read().strip()
    # last_checkpoint holds the path as seen from where training ran.
    for candidate in (named, osp.join(path, osp.basename(named))):
        if osp.isfile(candidate):
            return candidate
    raise FileNotFoundError(f'{marker} names {named}, which does not exist')


def load_image(source, short_side=None):
    """An RGB uint8 array from an image file or a scikit-image sample name (``SAMPLES``).

    Raises FileNotFoundError for a path that does not exist, ValueError for a file that
    is not a readable image and for a name that is neither a file nor a sample.
    """
    from PIL import Image, UnidentifiedImageError
    source = str(source)
    if osp.isfile(source):
        try:
            with Image.open(source) as f:
                img = f.convert('RGB')
        except (UnidentifiedImageError, OSError) as e:
            raise ValueError(f'{source} exists but is not a readable image: {e}') from e
    elif osp.isdir(source):
        raise ValueError(f'{source} is a directory, not an image file')
    elif source in SAMPLES:
        from skimage import data as skdata
        img = Image.fromarray(getattr(skdata, source)()).convert('RGB')
    elif osp.splitext(source)[1].lower() in IMAGE_EXTS or osp.sep in source:
        raise FileNotFoundError(f'no such image file: {source}')
    else:
        raise ValueError(f'{source!r} is neither an image file nor a scikit-image sample '
                         f'({", ".join(SAMPLES)})')
    if short_side:
        w, h = img.size
        s = short_side / min(w, h)
        img = img.resize((max(1, round(w * s)), max(1, round(h * s))), Image.BILINEAR)
    return np.asarray(img)


def describe(source):
    """What an input is: a sample's name and content, or the file name."""
    source = str(source)
    if not osp.isfile(source) and source in SAMPLES:
        return f'{source}: {SAMPLES[source]}'
    return osp.basename(source)


def to_tensor(images):
    """(list of) HxWx3 uint8 RGB -> normalized (B, 3, H, W) float tensor (ImageNet stats,
    as every shipped config's data preprocessor)."""
    if isinstance(images, np.ndarray):
        images = [images]
    x = torch.stack([torch.from_numpy(np.array(i)).permute(2, 0, 1).float()
                     for i in images])
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return (x - mean) / std


def dataset_images(config, num):
    """The first ``num`` images of a config's test (or val) dataset, or [] if the config has
    none or its files are not there."""
    from mmengine.config import Config
    cfg = Config.fromfile(config) if isinstance(config, str) else config
    for key in ('test_dataloader', 'val_dataloader'):
        dataset = (cfg.get(key) or {}).get('dataset') or {}
        prefix = dataset.get('data_prefix') or {}
        folder = prefix.get('img', prefix.get('img_path'))
        if folder is None:
            continue
        folder = osp.join(dataset.get('data_root', ''), folder)
        paths = sorted(p for p in glob.glob(osp.join(folder, '*'))
                       if p.lower().endswith(IMAGE_EXTS))
        if paths:
            return paths[:num]
    return []


def default_images(config, num, samples):
    """The model's own data when the config names images that exist, else the samples."""
    return (dataset_images(config, num) if config else []) or list(samples[:num])
