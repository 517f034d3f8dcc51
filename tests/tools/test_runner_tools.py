"""tools/train.py and tools/test.py: options become config settings (no training here;
the end-to-end runs are in test_pipelines.py)."""
import os.path as osp
import sys

import pytest
from conftest import ROOT, load_tool

MINI = osp.join(ROOT, 'configs', '_mini_', 'retinanet_soft-t_fpn_mini-coco.py')


def test_train_options_become_config_settings():
    train = load_tool('tools/train.py')
    cfg = train.build_cfg(train.parse_args([
        MINI, '--amp', '--resume', 'w/iter_4.pth', '--cfg-options', 'train_cfg.max_iters=7']))
    assert cfg.optim_wrapper.type == 'AmpOptimWrapper'
    assert cfg.optim_wrapper.loss_scale == 'dynamic'
    assert cfg.resume is True and cfg.load_from == 'w/iter_4.pth'
    assert cfg.train_cfg.max_iters == 7
    assert cfg.work_dir == osp.join('./work_dirs', 'retinanet_soft-t_fpn_mini-coco')
    cfg = train.build_cfg(train.parse_args([MINI, '--resume', '--work-dir', 'elsewhere']))
    assert cfg.resume is True and cfg.load_from is None and cfg.work_dir == 'elsewhere'


def test_auto_scale_lr_needs_a_base_batch_size():
    train = load_tool('tools/train.py')
    args = train.parse_args([MINI, '--auto-scale-lr', '--cfg-options',
                             'auto_scale_lr.base_batch_size=16'])
    assert train.build_cfg(args).auto_scale_lr.enable is True
    cfg_without = train.parse_args([MINI, '--auto-scale-lr'])
    from mmengine.config import Config
    if 'base_batch_size' not in Config.fromfile(MINI).get('auto_scale_lr', {}):
        with pytest.raises(ValueError, match='base_batch_size'):
            train.build_cfg(cfg_without)


def test_test_tool_refuses_a_non_pickle_out():
    test_tool = load_tool('tools/test.py')  # by path: the stdlib has a package ``test``
    with pytest.raises(SystemExit, match='.pkl'):
        test_tool.main([MINI, 'ckpt.pth', '--out', 'results.json'])
    args = test_tool.parse_args([MINI, 'ckpt.pth', '--work-dir', 'w'])
    assert args.checkpoint == 'ckpt.pth' and args.work_dir == 'w'


def test_wheel_ships_every_config_and_tool(tmp_path):
    """`pip install .` must give mim every config and tool (subfolders included), and the
    model index with its metafiles (`mim search mmsoft`)."""
    import shutil
    import subprocess
    import zipfile
    files = subprocess.run(['git', 'ls-files', '--cached', '--others', '--exclude-standard'],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    src = tmp_path / 'src'
    for f in files:
        if osp.isfile(osp.join(ROOT, f)) and not f.startswith('tests/'):
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(osp.join(ROOT, f), src / f)
    subprocess.run([sys.executable, '-m', 'pip', 'wheel', '-q', '--no-deps',
                    '--no-build-isolation', str(src), '-w', str(tmp_path / 'dist')],
                   check=True, capture_output=True)
    wheel, = (tmp_path / 'dist').glob('mmsoft-*.whl')
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = {'mmsoft/.mim/' + f for f in files
              if f.startswith(('tools/', 'configs/'))
              and f.endswith(('.py', '.sh', '.yml', '.md')) and osp.isfile(osp.join(ROOT, f))}
    assert wanted and not wanted - names, sorted(wanted - names)
    assert 'mmsoft/.mim/configs/soft/metafile.yml' in wanted
    assert {'mmsoft/.mim/README.md', 'mmsoft/.mim/model-index.yml'} <= names
