"""What the analysis tools and tools/demo.py share: their inputs (images, weights), the
random-weights warning and the figure of one map over an image.

The math they run lives in ``mmsoft.analysis``; this module is only the plumbing around it.
"""
import argparse
import glob
import logging
import os.path as osp
import sys

import numpy as np
import torch

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


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

RANDOM_WEIGHTS = 'RANDOM WEIGHTS'

logger = logging.getLogger('mmsoft.tools')


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


def tool_parser(doc):
    """An argument parser for a tool whose module docstring is ``doc``: first paragraph
    as description, the rest (examples) as epilog."""
    first, _, rest = doc.partition('\n\n')
    return argparse.ArgumentParser(description=first, epilog=rest,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


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


def add_model_args(parser, backbone='SOFT:small'):
    """--backbone / --config / --checkpoint; ``backbone=None`` leaves --backbone out (tools
    that need a whole detector or segmentor)."""
    if backbone:
        parser.add_argument('--backbone',
                            help=f'SOFT:ARCH or XCiTSimA:ARCH (default {backbone})')
        parser.add_argument('--config', help='take the backbone from this config')
    else:
        parser.add_argument('--config', help='detector or segmentor config (required)')
    parser.add_argument('--checkpoint',
                        help='weights: a .pth (official, mmengine or converted) or a work '
                        'dir (its last_checkpoint); without it the weights are RANDOM and '
                        'the tool says so')


def build_backbone(args):
    """The backbone the options name, and the weights tag for titles ('random weights'
    or the checkpoint's file name)."""
    from mmsoft.analysis import build_backbone as build
    checkpoint = resolve_checkpoint(args.checkpoint)
    model = build(args.backbone, args.config, checkpoint)
    if checkpoint is None:
        return model, warn_random_weights(model_name(args))
    return model, osp.basename(checkpoint)


def warn_random_weights(what, consequence=''):
    """Say loudly that ``what`` runs without trained weights; returns the tag for titles."""
    logger.warning(f'{what} has RANDOM WEIGHTS (no --checkpoint): the output shows an '
                   f'untrained network{consequence}. Pass --checkpoint FILE (or a work dir) '
                   'for a trained one.')
    return RANDOM_WEIGHTS


def setup_logging():
    """Tool messages (``mmsoft.tools``) on stderr, one line each (they still propagate to
    the root logger, where a caller may collect them too)."""
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter('[%(levelname)s] %(message)s'))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def model_name(args):
    """A short name for titles: the config's file name or the backbone spec."""
    if getattr(args, 'config', None):
        return osp.splitext(osp.basename(args.config))[0]
    return args.backbone or 'SOFT:small'


def figure(width, height, dpi=100):
    """A matplotlib Figure not registered with pyplot (nothing to close, no GUI), laid out
    by matplotlib's constrained layout (titles, colorbars and labels do not overlap)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width, height), dpi=dpi, layout='constrained')
    FigureCanvasAgg(fig)  # a renderer to measure text with
    return fig


def map_figure(image, heat, title, label, marker=None, alpha=0.5, cmap='jet'):
    """``heat`` (h, w), upsampled to the image, over ``image`` (HxWx3 uint8) with a
    colorbar labelled ``label`` and an optional '+' at ``marker`` = (y, x) pixels.
    Small values are shown scaled by a power of ten, which the colorbar label states.

    Returns:
        matplotlib.figure.Figure
    """
    import math

    import matplotlib
    import torch.nn.functional as F
    heat = torch.as_tensor(heat, dtype=torch.float32)[None, None]
    heat = F.interpolate(heat, size=image.shape[:2], mode='bilinear', align_corners=False)
    heat = heat[0, 0].double().numpy()
    peak = float(np.abs(heat).max())
    exponent = math.floor(math.log10(peak)) if peak > 0 else 0
    if abs(exponent) >= 3:
        heat = heat / 10.0**exponent
        label = f'{label}, ×1e{exponent}'
    H, W = image.shape[:2]
    fig = figure(6.6, 5.4 * H / W + 0.3 + 0.2 * title.count('\n'))
    ax = fig.add_subplot()
    ax.imshow(image)
    norm = matplotlib.colors.Normalize(float(heat.min()), float(heat.max()))
    ax.imshow(heat, cmap=cmap, norm=norm, alpha=alpha)
    if marker is not None:
        ax.plot(marker[1], marker[0], marker='+', color='white', markersize=18,
                markeredgewidth=3)
        ax.plot(marker[1], marker[0], marker='+', color='black', markersize=14,
                markeredgewidth=1.2)
    ax.set_axis_off()
    ax.set_title(title, fontsize=9)
    # The colorbar shows the colormap opaque (the overlay is blended with the image).
    colors = matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap)
    cax = ax.inset_axes([1.03, 0, 0.045, 1])  # as tall as the image
    fig.colorbar(colors, cax=cax, label=label)
    return fig
