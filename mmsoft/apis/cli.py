"""The command line every mmsoft tool shares: model options, weights, messages.

Kept in the library so that the tools under tools/ import it like any other module,
without touching ``sys.path``.
"""
import argparse
import logging
import os.path as osp
import sys

from .inference import init_backbone, resolve_checkpoint

__all__ = [
    'RANDOM_WEIGHTS', 'add_model_args', 'backbone_from_args', 'logger', 'model_name',
    'setup_logging', 'tool_parser', 'warn_random_weights'
]

RANDOM_WEIGHTS = 'RANDOM WEIGHTS'

logger = logging.getLogger('mmsoft.tools')


def tool_parser(doc):
    """An argument parser for a tool whose module docstring is ``doc``: first paragraph
    as description, the rest (examples) as epilog."""
    first, _, rest = doc.partition('\n\n')
    return argparse.ArgumentParser(description=first, epilog=rest,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


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


def backbone_from_args(args):
    """The backbone the options name, and the weights tag for titles ('random weights'
    or the checkpoint's file name). mmengine's INFO lines show, among them the one on
    what the checkpoint filled and what it did not."""
    checkpoint = resolve_checkpoint(args.checkpoint)
    model = init_backbone(args.backbone, args.config, checkpoint, log_level='INFO')
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
