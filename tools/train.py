"""Train a detector, segmentor or classifier with an mmsoft backbone.

The codebase (mmdet, mmseg or mmpretrain) is chosen from the config's ``default_scope``, so
one tool serves every config under configs/. Same options as mmdet's and mmseg's own
tools/train.py (mmseg's bare --resume included); `mim train mmsoft CONFIG` runs this file.
An option the config cannot serve stops the tool with a message that names what the
config lacks.
"""
from mmsoft.apis.runner import (OptionError, build_runner, load_config, parse_runner_args,
                                 runner_parser)


def build_parser():
    """The argument parser of this tool."""
    p = runner_parser('Train a model with an mmsoft backbone', 'train config file path')
    p.add_argument('--amp', action='store_true', default=False,
                   help='automatic mixed precision (AmpOptimWrapper, dynamic loss scale)')
    p.add_argument('--auto-scale-lr', action='store_true',
                   help='scale the learning rate by (total batch / '
                   'auto_scale_lr.base_batch_size)')
    p.add_argument('--resume', nargs='?', type=str, const='auto',
                   help='resume from the given checkpoint, or without one from the latest '
                   'checkpoint in work_dir')
    return p


def parse_args(argv=None):
    """The options of ``argv`` (default: the command line); sets ``LOCAL_RANK`` from
    --local-rank when the launcher did not."""
    return parse_runner_args(build_parser(), argv)


def build_cfg(args):
    cfg = load_config(args)
    if args.amp:
        wrapper = cfg.get('optim_wrapper')
        if wrapper is None:
            raise OptionError('--amp needs an optim_wrapper in the config')
        kind = wrapper.get('type', 'OptimWrapper').split('.')[-1]  # mmengine.OptimWrapper
        if kind not in ('OptimWrapper', 'AmpOptimWrapper'):
            # as mmseg's tool: only the plain wrapper has a mixed-precision twin
            raise OptionError(f'--amp replaces optim_wrapper.type OptimWrapper by '
                              f'AmpOptimWrapper, and the config\'s is {kind}')
        wrapper.type = 'AmpOptimWrapper'
        wrapper.setdefault('loss_scale', 'dynamic')
    if args.auto_scale_lr:
        if 'auto_scale_lr' not in cfg or 'base_batch_size' not in cfg.auto_scale_lr:
            raise OptionError('--auto-scale-lr needs auto_scale_lr.base_batch_size in the '
                              'config: e.g. auto_scale_lr = dict(base_batch_size=16)')
        cfg.auto_scale_lr.enable = True
    if args.resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif args.resume is not None:
        cfg.resume = True
        cfg.load_from = args.resume
    return cfg


def main(argv=None):
    try:
        cfg = build_cfg(parse_args(argv))
    except OptionError as e:
        raise SystemExit(f'tools/train.py: error: {e}') from None
    build_runner(cfg).train()


if __name__ == '__main__':
    main()
