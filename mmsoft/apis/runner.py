"""Training and testing with mmengine's Runner: the options tools/train.py and
tools/test.py share, the config they build and the runner they start."""
import argparse
import os
import os.path as osp

from mmengine.config import Config, DictAction
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

__all__ = ['OptionError', 'build_runner', 'load_config', 'parse_runner_args', 'runner_parser']


class OptionError(ValueError):
    """A tool option the config cannot serve; the tools report it without a traceback."""


def runner_parser(description, config_help):
    """An argument parser with the options both tools take."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument('config', help=config_help)
    p.add_argument('--work-dir', help='the dir to save logs, checkpoints and metrics '
                   '(default: work_dirs/<config name>)')
    p.add_argument('--cfg-options', nargs='+', action=DictAction,
                   help='override config settings, e.g. train_cfg.max_iters=100')
    p.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                   default='none', help='job launcher')
    p.add_argument('--local_rank', '--local-rank', type=int, default=0)
    return p


def parse_runner_args(p, argv=None):
    args = p.parse_args(argv)
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def load_config(args):
    """The config with the common options applied (mmsoft imported first: it registers the
    backbones and keeps weights_only checkpoint loading usable)."""
    import mmsoft  # noqa: F401  (registers the backbones, guards checkpoint loading)
    cfg = Config.fromfile(args.config)
    cfg.launcher = args.launcher
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(args.config))[0])
    return cfg


def build_runner(cfg):
    from ..engine import setup_cpu_distributed
    setup_cpu_distributed(cfg)  # torchrun without CUDA: gloo, DDP without device_ids
    return Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)
