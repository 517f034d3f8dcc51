"""Train a detector, segmentor or classifier with an mmsoft backbone.

The codebase (mmdet, mmseg or mmpretrain) is chosen from the config's ``default_scope``, so
one tool serves every config under configs/. Same options as the codebases' own
tools/train.py; `mim train mmsoft CONFIG` runs this file.
"""
from mmsoft.apis.runner import build_runner, load_config, parse_runner_args, runner_parser


def build_parser():
    """The argument parser of this tool."""
    p = runner_parser('Train a model with an mmsoft backbone', 'train config file path')
    p.add_argument('--amp', action='store_true', help='automatic mixed precision')
    p.add_argument('--auto-scale-lr', action='store_true',
                   help='scale the learning rate by (total batch / base_batch_size)')
    p.add_argument('--resume', nargs='?', type=str, const='auto',
                   help='resume from the given checkpoint, or from the latest one in '
                   'work_dir')
    return p


def parse_args(argv=None):
    """The options of ``argv`` (default: the command line); sets ``LOCAL_RANK`` from
    --local-rank when the launcher did not."""
    return parse_runner_args(build_parser(), argv)


def build_cfg(args):
    cfg = load_config(args)
    if args.amp:
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')
    if args.auto_scale_lr:
        if 'auto_scale_lr' not in cfg or 'base_batch_size' not in cfg.auto_scale_lr:
            raise ValueError('--auto-scale-lr needs auto_scale_lr.base_batch_size in the '
                             'config')
        cfg.auto_scale_lr.enable = True
    if args.resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif args.resume is not None:
        cfg.resume = True
        cfg.load_from = args.resume
    return cfg


def main(argv=None):
    cfg = build_cfg(parse_args(argv))
    build_runner(cfg).train()


if __name__ == '__main__':
    main()
