"""tools/train.py and tools/test.py take every option of MMDetection's and MMSegmentation's
own tools/train.py and tools/test.py (the ones shipped in the installed packages, under
``.mim/tools``), with the same meaning, and apply --out, --show, --show-dir and --tta as the
config's codebase does."""
import argparse
import importlib
import io
import os.path as osp
import re
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout

import pytest
from conftest import ROOT, load_tool, run, untrained_checkpoint

PY = sys.executable
DET = osp.join(ROOT, 'configs', '_mini_', 'retinanet_soft-t_fpn_mini-coco.py')
SEG = osp.join(ROOT, 'configs', '_mini_', 'upernet_soft-t_mini-ade.py')
TOOLS = [(package, tool) for package in ('mmdet', 'mmseg') for tool in ('train', 'test')]
# mmseg's train.py takes a bare --resume only (store_true): ours reads it as 'auto', the
# latest checkpoint in work_dir, which is what mmseg's True means.
SAME_MEANING = {('resume', True): 'auto', ('resume', False): None}


def installed_tool(package, tool):
    """The path of the codebase's own tools/<tool>.py in the installed package."""
    path = osp.join(osp.dirname(importlib.import_module(package).__file__), '.mim', 'tools',
                    f'{tool}.py')
    if not osp.isfile(path):
        pytest.skip(f'{package} is installed without its tools ({path})')
    return path


def call_parse_args(module, argv, monkeypatch):
    """``module.parse_args()`` on the command line ``argv``: the namespace as a dict, or
    None when the parser refuses it; with ``--help``, the help text."""
    monkeypatch.setattr(sys, 'argv', ['tool'] + argv)
    monkeypatch.setenv('LOCAL_RANK', '0')  # their parse_args() sets it when absent
    monkeypatch.setenv('COLUMNS', '200')
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        try:
            return vars(module.parse_args())
        except SystemExit:
            return out.getvalue() or None


def option_forms(help_text):
    """From argparse's help: the positional arguments, and {option string: what follows it}
    ('' for a flag, 'X', '[X]', 'X [X ...]' or '{a,b}')."""
    positionals, forms, section = [], {}, ''
    for line in help_text.splitlines():
        if line and not line.startswith(' '):
            section = line
            continue
        invocation = re.match(r' {2}(\S.*?)(?: {2,}|$)', line)
        if invocation is None:
            continue
        if invocation.group(1).startswith('-'):
            for part in invocation.group(1).split(', '):
                option, _, rest = part.partition(' ')
                forms[option] = rest
        elif section.startswith('positional'):
            positionals.append(invocation.group(1))
    return positionals, forms


def sample_argvs(option, form):
    """Command lines that use ``option`` in each way its form allows; VALUE is filled in."""
    if form == '':
        return [[option]]
    if form.startswith('{'):
        return [[option, choice] for choice in form.strip('{}').split(',')]
    if form.startswith('['):
        return [[option], [option, 'VALUE']]
    return [[option, 'VALUE']]


def differences(their_module, build_parser, monkeypatch):
    """How mmsoft's parser (``build_parser()``) differs from the codebase tool's on every
    option the tool's help lists: refused command lines, or options read otherwise."""
    help_text = call_parse_args(their_module, ['--help'], monkeypatch)
    positionals, forms = option_forms(help_text)
    assert positionals and '--work-dir' in forms, help_text  # the help was read
    head = [f'{name}.py' for name in positionals]
    problems = []
    for option, form in forms.items():
        if option in ('-h', '--help'):
            continue
        tried = 0
        for argv in sample_argvs(option, form):
            for value in ('a=1', '2'):  # a key=value (--cfg-options), then a number
                filled = [value if word == 'VALUE' else word for word in argv]
                theirs = call_parse_args(their_module, head + filled, monkeypatch)
                if theirs is not None:
                    break
            else:
                continue
            tried += 1
            try:
                with redirect_stderr(io.StringIO()):
                    ours = vars(build_parser().parse_args(head + filled))
            except SystemExit:
                problems.append(f'refuses {" ".join(filled)}')
                continue
            for key, value in theirs.items():
                expected = SAME_MEANING.get((key, value), value) if isinstance(
                    value, (bool, type(None))) else value
                if key not in ours or ours[key] != expected:
                    problems.append(f'{" ".join(filled)}: {key} is {ours.get(key, "absent")!r}'
                                    f', the tool has {value!r}')
        assert tried, f'no sample of {option} {form} parsed with the tool itself'
    return problems


@pytest.mark.parametrize('package,tool', TOOLS)
def test_every_option_of_the_codebase_tools(package, tool, monkeypatch):
    theirs = load_tool(installed_tool(package, tool))
    ours = load_tool(f'tools/{tool}.py')
    assert differences(theirs, ours.build_parser, monkeypatch) == []


@pytest.mark.parametrize('tool,dropped', [('test', '--show-dir'), ('train', '--amp'),
                                          ('test', '--local-rank')])
def test_a_missing_option_is_found(tool, dropped, monkeypatch):
    """Negative control: mmsoft's own build_parser() with one option left out."""
    ours = load_tool(f'tools/{tool}.py')
    add_argument = argparse.ArgumentParser.add_argument

    def add_all_but_dropped(parser, *names, **kwargs):
        return None if dropped in names else add_argument(parser, *names, **kwargs)

    def build_lacking():
        with monkeypatch.context() as m:
            m.setattr(argparse.ArgumentParser, 'add_argument', add_all_but_dropped)
            return ours.build_parser()

    theirs = load_tool(installed_tool('mmdet', tool))
    problems = differences(theirs, build_lacking, monkeypatch)
    dest = dropped.lstrip('-').replace('-', '_')
    assert any(p.startswith(f'refuses {dropped}') for p in problems), problems
    assert all(dest in p.replace('-', '_') for p in problems), problems  # nothing else


# --- the options as the config's codebase applies them -----------------------------------

def test_show_and_show_dir_as_each_codebase_does():
    """The visualization settings equal those the codebase's own tool makes."""
    from mmengine.config import Config
    from mmdet.engine.hooks.utils import trigger_visualization_hook as mmdet_trigger
    mmseg_trigger = load_tool(installed_tool('mmseg', 'test')).trigger_visualization_hook
    test = load_tool('tools/test.py')
    for cfg_path, trigger in ((DET, mmdet_trigger), (SEG, mmseg_trigger)):
        for options in (['--show-dir', 'vis'], ['--show', '--wait-time', '0.5'],
                        ['--show', '--show-dir', 'vis']):
            args = test.parse_args([cfg_path, 'ckpt.pth'] + options)
            ours = test.build_cfg(args)
            theirs = trigger(Config.fromfile(cfg_path), args)
            assert ours.default_hooks.visualization == theirs.default_hooks.visualization
            assert ours.visualizer == theirs.visualizer
            assert ours.default_hooks.visualization.draw is True


def test_show_dir_names_a_missing_visualization_hook():
    test = load_tool('tools/test.py')
    for cfg_path, hook in ((DET, 'DetVisualizationHook'), (SEG, 'SegVisualizationHook')):
        args = test.parse_args([cfg_path, 'ckpt.pth', '--show-dir', 'vis', '--cfg-options',
                                'default_hooks.visualization=None'])
        with pytest.raises(test.OptionError,
                           match=f'default_hooks.visualization is missing.*{hook}'):
            test.build_cfg(args)


def test_out_as_each_codebase_does():
    test = load_tool('tools/test.py')
    # mmseg: a directory for the predicted masks (its IoUMetric's output_dir)
    cfg = test.build_cfg(test.parse_args([SEG, 'ckpt.pth', '--out', 'masks']))
    assert cfg.test_evaluator.output_dir == 'masks'
    assert cfg.test_evaluator.keep_results is True
    # mmdet: a pickle file only
    with pytest.raises(SystemExit, match=r'\.pkl'):
        test.main([DET, 'ckpt.pth', '--out', 'results.json'])
    cfg = test.build_cfg(test.parse_args([SEG, 'ckpt.pth', '--out', 'r.pkl']))
    assert 'output_dir' not in cfg.test_evaluator  # a pickle, dumped as before


def test_tta_as_each_codebase_does():
    from mmengine.config import Config
    test = load_tool('tools/test.py')
    # mmseg: the config's own tta_model and tta_pipeline
    plain = Config.fromfile(SEG)
    cfg = test.build_cfg(test.parse_args([SEG, 'ckpt.pth', '--tta']))
    assert cfg.model.type == plain.tta_model.type == 'SegTTAModel'
    assert cfg.model.module == plain.model
    assert cfg.test_dataloader.dataset.pipeline == plain.tta_pipeline
    # mmdet without them: horizontal-flip TTA merged by DetTTAModel
    plain = Config.fromfile(DET)
    assert 'tta_model' not in plain and 'tta_pipeline' not in plain
    with pytest.warns(UserWarning, match='tta_model and tta_pipeline'):
        cfg = test.build_cfg(test.parse_args([DET, 'ckpt.pth', '--tta']))
    assert cfg.model.type == 'DetTTAModel' and cfg.model.module == plain.model
    pipeline = cfg.test_dataloader.dataset.pipeline
    assert pipeline[:-1] == plain.test_dataloader.dataset.pipeline[:-1]
    assert pipeline[-1].type == 'TestTimeAug'
    flips, (pack,) = pipeline[-1].transforms
    assert sorted(f['prob'] for f in flips) == [0., 1.]
    assert pack['type'] == 'PackDetInputs' and 'flip' in pack['meta_keys']


def test_tta_names_what_the_config_lacks(tmp_path):
    """A segmentation config without TTA settings: a message, no traceback."""
    cfg = tmp_path / 'no_tta.py'
    cfg.write_text(f'_base_ = {SEG!r}\ntta_model = None\ntta_pipeline = None\n')
    res = subprocess.run([PY, osp.join(ROOT, 'tools/test.py'), str(cfg), 'ckpt.pth',
                          '--tta'], cwd=tmp_path, capture_output=True, text=True)
    assert res.returncode != 0
    assert 'Traceback' not in res.stderr, res.stderr[-3000:]
    assert re.search(r'--tta needs tta_model and tta_pipeline in the config',
                     res.stderr), res.stderr[-3000:]


def test_train_options_name_what_the_config_lacks():
    train = load_tool('tools/train.py')
    with pytest.raises(SystemExit, match='--auto-scale-lr needs '
                       'auto_scale_lr.base_batch_size'):
        train.main([SEG, '--auto-scale-lr'])
    with pytest.raises(SystemExit, match='--amp .* the config\'s is ApexOptimWrapper'):
        train.main([SEG, '--amp', '--cfg-options', 'optim_wrapper.type=ApexOptimWrapper'])
    cfg = train.build_cfg(train.parse_args([SEG, '--amp', '--resume']))
    assert cfg.optim_wrapper.type == 'AmpOptimWrapper'
    assert cfg.resume is True and cfg.load_from is None


# --- a test run on the mini sets ---------------------------------------------------------

@pytest.fixture(scope='module')
def mini(tmp_path_factory):
    """data/ with 3 validation images, and untrained checkpoints of both mini configs."""
    d = tmp_path_factory.mktemp('tools')
    run([PY, osp.join(ROOT, 'tools/misc/make_mini_dataset.py'), '--out', str(d / 'data'),
         '--train', '1', '--val', '3'], d)
    return (d, untrained_checkpoint(DET, d / 'det.pth'),
            untrained_checkpoint(SEG, d / 'seg.pth'))


def image_sizes(paths):
    from PIL import Image
    return {osp.basename(p): Image.open(p).size for p in paths}


@pytest.mark.slow
def test_show_dir_tta_and_out_on_the_mini_sets(mini):
    import glob
    import pickle
    d, det_ckpt, seg_ckpt = mini
    val = image_sizes(glob.glob(str(d / 'data/mini_coco/val/*.png')))
    assert len(val) == 3
    # detection: images under work_dir/<timestamp>/vis, ground truth beside the
    # predictions (twice as wide); --tta reads the images through the flip pipeline
    run([PY, osp.join(ROOT, 'tools/test.py'), DET, det_ckpt, '--work-dir', 'det',
         '--show-dir', 'vis', '--tta', '--out', 'det.pkl'], d)
    drawn = image_sizes(glob.glob(str(d / 'det/*/vis/*.png')))
    assert drawn == {name: (2 * w, h) for name, (w, h) in val.items()}
    with open(d / 'det.pkl', 'rb') as f:
        predictions = pickle.load(f)
    assert sorted(osp.basename(p['img_path']) for p in predictions) == sorted(val)
    assert all('pred_instances' in p and 'flip' in p for p in predictions)
    # segmentation: mmseg's hook saves through the visualizer under SHOW_DIR/vis_data;
    # --out DIR holds the predicted masks
    run([PY, osp.join(ROOT, 'tools/test.py'), SEG, seg_ckpt, '--work-dir', 'seg',
         '--show-dir', 'segvis', '--out', 'masks', '--cfg-options',
         'default_hooks.visualization.interval=1'], d)
    drawn = image_sizes(glob.glob(str(d / 'segvis/vis_data/vis_image/*.png')))
    assert sorted(drawn.values()) == sorted((2 * w, h) for w, h in val.values())
    masks = image_sizes(glob.glob(str(d / 'masks/*.png')))
    assert masks == {name: val[name] for name in masks} and len(masks) == 3
