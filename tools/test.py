"""Test (evaluate) a trained model with an mmsoft backbone.

The codebase (mmdet, mmseg or mmpretrain) is chosen from the config's ``default_scope``.
`mim test mmsoft CONFIG --checkpoint CKPT` runs this file; mmdet's and mmseg's own
tools/test.py work too, because the configs import mmsoft through ``custom_imports``.

The options are those of mmdet's and mmseg's tools/test.py, with the meaning of the
config's own codebase where the two differ (--out, --show-dir, --tta); an option the config
cannot serve stops the tool with a message that names what the config lacks.
"""
import warnings

from mmsoft.apis.runner import (OptionError, build_runner, load_config, parse_runner_args,
                                 runner_parser)

CODEBASES = ('mmdet', 'mmseg', 'mmpretrain')
# The visualization hook each codebase's default_runtime.py puts in default_hooks.
VISUALIZATION_HOOKS = dict(mmdet='DetVisualizationHook', mmseg='SegVisualizationHook',
                           mmpretrain='VisualizationHook')
PICKLE = ('.pkl', '.pickle')


def build_parser():
    """The argument parser of this tool."""
    p = runner_parser('Test a model with an mmsoft backbone', 'test config file path')
    p.add_argument('checkpoint', help='checkpoint file')
    p.add_argument('--out', type=str,
                   help='detection and classification configs: dump the predictions to '
                   'this pickle file (.pkl); segmentation configs: save the predicted '
                   'masks as PNG files in this directory (a .pkl name dumps a pickle)')
    p.add_argument('--show', action='store_true',
                   help='show the predictions in a window (the config\'s visualization '
                   'hook)')
    p.add_argument('--show-dir',
                   help='save images with the predictions drawn: detection configs under '
                   'WORK_DIR/TIMESTAMP/SHOW_DIR, segmentation configs under '
                   'SHOW_DIR/vis_data/vis_image (every default_hooks.visualization.interval'
                   '-th image), classification configs in SHOW_DIR')
    p.add_argument('--wait-time', type=float, default=2,
                   help='seconds each image is shown with --show')
    p.add_argument('--tta', action='store_true',
                   help='test-time augmentation with the config\'s tta_model and '
                   'tta_pipeline (detection and classification configs without them: '
                   'horizontal-flip TTA, as mmdet and mmpretrain do)')
    return p


def parse_args(argv=None):
    """The options of ``argv`` (default: the command line); sets ``LOCAL_RANK`` from
    --local-rank when the launcher did not."""
    return parse_runner_args(build_parser(), argv)


def codebase_of(cfg, option):
    """'mmdet', 'mmseg' or 'mmpretrain', from the config's ``default_scope``."""
    scope = cfg.get('default_scope')
    if scope not in CODEBASES:
        raise OptionError(f'{option} acts as the config\'s codebase does, and the config\'s '
                          f'default_scope is {scope!r}, none of {", ".join(CODEBASES)}')
    return scope


def enable_visualization(cfg, args, codebase):
    """--show / --show-dir: turn the config's visualization hook on, as the codebase's
    tools/test.py does."""
    option = '--show' if args.show else '--show-dir'
    hook = (cfg.get('default_hooks') or {}).get('visualization')
    if hook is None:
        raise OptionError(
            f'{option} needs a visualization hook in the config, and '
            f'default_hooks.visualization is missing: add default_hooks = dict('
            f"visualization=dict(type='{VISUALIZATION_HOOKS[codebase]}'))")
    if codebase == 'mmpretrain':
        # mmpretrain's hook: enable / out_dir, every sample (its tool's --interval 1)
        hook.update(enable=True, show=args.show, wait_time=args.wait_time,
                    out_dir=args.show_dir, interval=1)
        return
    hook.draw = True
    if args.show:
        hook.update(show=True, wait_time=args.wait_time)
    if args.show_dir is None:
        return
    if codebase == 'mmdet':
        hook.test_out_dir = args.show_dir  # the hook saves under work_dir/timestamp/
    else:
        # mmseg's hook draws through the visualizer's backends, saving under save_dir
        if cfg.get('visualizer') is None:
            raise OptionError("--show-dir needs a visualizer in the config, and "
                              "'visualizer' is missing: add visualizer = dict("
                              "type='SegLocalVisualizer', vis_backends=[dict("
                              "type='LocalVisBackend')])")
        cfg.visualizer.save_dir = args.show_dir


def _test_dataset(cfg):
    """The test dataset's config that holds the pipeline (inside dataset wrappers)."""
    dataset = (cfg.get('test_dataloader') or {}).get('dataset')
    while dataset is not None and 'pipeline' not in dataset and 'dataset' in dataset:
        dataset = dataset['dataset']
    if dataset is None or 'pipeline' not in dataset:
        raise OptionError('--tta needs test_dataloader.dataset.pipeline in the config')
    return dataset


def _flip_tta_pipeline(pipeline, codebase):
    """mmdet's and mmpretrain's default TTA pipeline: the test pipeline with its last
    transform (the packing) run on the image and on its horizontal flip."""
    flips = [dict(type='RandomFlip', prob=1.), dict(type='RandomFlip', prob=0.)]
    if codebase == 'mmdet':
        pack = dict(type='PackDetInputs',
                    meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                               'scale_factor', 'flip', 'flip_direction'))
    else:
        pack = pipeline[-1]
    return list(pipeline[:-1]) + [dict(type='TestTimeAug', transforms=[flips, [pack]])]


def enable_tta(cfg, codebase):
    """--tta: the model wrapped in the config's ``tta_model``, the test set read through
    its ``tta_pipeline``. mmseg has no default for either; mmdet and mmpretrain use
    horizontal-flip TTA (DetTTAModel with NMS, AverageClsScoreTTA) where they are missing."""
    from mmengine.config import ConfigDict
    dataset = _test_dataset(cfg)
    missing = [key for key in ('tta_model', 'tta_pipeline') if cfg.get(key) is None]
    if codebase == 'mmseg' and missing:
        raise OptionError(
            f'--tta needs {" and ".join(missing)} in the config (MMSegmentation has no '
            "default): e.g. tta_model = dict(type='SegTTAModel') and a tta_pipeline "
            "with a TestTimeAug transform, as in mmseg's dataset configs")
    if 'tta_model' in missing:
        cfg.tta_model = (dict(type='DetTTAModel', tta_cfg=dict(
            nms=dict(type='nms', iou_threshold=0.5), max_per_img=100))
            if codebase == 'mmdet' else dict(type='mmpretrain.AverageClsScoreTTA'))
    if 'tta_pipeline' in missing:
        cfg.tta_pipeline = _flip_tta_pipeline(dataset['pipeline'], codebase)
    if missing:
        warnings.warn(f'--tta: the config has no {" and ".join(missing)}; using '
                      f'horizontal-flip TTA ({cfg.tta_model["type"]})')
    cfg.model = ConfigDict(**cfg.tta_model, module=cfg.model)
    dataset['pipeline'] = cfg.tta_pipeline


def build_cfg(args):
    """The config of the test run, every option applied (OptionError when the config
    cannot serve one)."""
    cfg = load_config(args)
    cfg.load_from = args.checkpoint
    codebase = None
    # A pickle file is the same in every codebase; the other options need the codebase.
    for option, given in (('--out', args.out is not None and not args.out.endswith(PICKLE)),
                          ('--show', args.show), ('--show-dir', args.show_dir is not None),
                          ('--tta', args.tta)):
        if given:
            codebase = codebase_of(cfg, option)
    if args.out is not None and not args.out.endswith(PICKLE):
        if codebase == 'mmseg':
            # mmseg's IoUMetric writes the predicted masks into output_dir
            evaluator = cfg.get('test_evaluator')
            if not isinstance(evaluator, dict):
                raise OptionError('--out DIR on a segmentation config needs test_evaluator '
                                  f'to be one metric (a dict), got {type(evaluator).__name__}')
            evaluator.update(output_dir=args.out, keep_results=True)
        else:
            raise OptionError(f'--out must be a .pkl file for an {codebase} config, got '
                              f'{args.out}')
    if args.show or args.show_dir is not None:
        enable_visualization(cfg, args, codebase)
    if args.tta:
        enable_tta(cfg, codebase)
    return cfg


def main(argv=None):
    args = parse_args(argv)
    try:
        cfg = build_cfg(args)
    except OptionError as e:
        raise SystemExit(f'tools/test.py: error: {e}') from None
    runner = build_runner(cfg)
    if args.out is not None and args.out.endswith(PICKLE):
        if cfg.get('default_scope') == 'mmdet':
            from mmdet.evaluation import DumpDetResults as DumpResults  # masks as RLE
        else:
            from mmengine.evaluator import DumpResults
        runner.test_evaluator.metrics.append(DumpResults(out_file_path=args.out))
    return runner.test()


if __name__ == '__main__':
    main()
