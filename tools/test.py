"""Test (evaluate) a trained model with an mmsoft backbone.

The codebase (mmdet, mmseg or mmpretrain) is chosen from the config's ``default_scope``.
`mim test mmsoft CONFIG --checkpoint CKPT` runs this file; mmdet's and mmseg's own
tools/test.py work too, because the configs import mmsoft through ``custom_imports``.
"""
from mmsoft.apis.runner import build_runner, load_config, parse_runner_args, runner_parser


def build_parser():
    """The argument parser of this tool."""
    p = runner_parser('Test a model with an mmsoft backbone', 'test config file path')
    p.add_argument('checkpoint', help='checkpoint file')
    p.add_argument('--out', help='dump predictions to this pickle file')
    return p


def parse_args(argv=None):
    """The options of ``argv`` (default: the command line); sets ``LOCAL_RANK`` from
    --local-rank when the launcher did not."""
    return parse_runner_args(build_parser(), argv)


def main(argv=None):
    args = parse_args(argv)
    if args.out is not None and not args.out.endswith(('.pkl', '.pickle')):
        raise SystemExit('--out must be a .pkl file')
    cfg = load_config(args)
    cfg.load_from = args.checkpoint
    runner = build_runner(cfg)
    if args.out is not None:
        from mmengine.evaluator import DumpResults
        runner.test_evaluator.metrics.append(DumpResults(out_file_path=args.out))
    return runner.test()


if __name__ == '__main__':
    main()
