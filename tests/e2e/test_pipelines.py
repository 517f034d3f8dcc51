"""End-to-end on the generated mini sets, as a user runs it: tools/train.py →
checkpoint → --resume → tools/test.py (and mim, and mmdet's own test tool), comparing the
trained model's metric with the untrained one's; a training run killed after a
checkpoint and resumed (CI runs it on the OneDL stack too). Minutes: marked ``slow``."""
import os
import os.path as osp
import re
import shutil
import subprocess
import sys

import pytest
import torch

from mmsoft.checkpoint import load as mmsoft_load  # weights_only with what mmengine saves
from mmsoft.compat import installed_version
from conftest import ROOT, run, untrained_checkpoint

PY = sys.executable
DET_CFG = osp.join(ROOT, 'configs/_mini_/retinanet_soft-t_fpn_mini-coco.py')
SEG_CFG = osp.join(ROOT, 'configs/_mini_/upernet_soft-t_mini-ade.py')
# onedl-mim reads the codebase name 'mmdet' as an abbreviation of both onedl-mmdetection
# and mmdet3d and refuses it; its users name the distribution.
ONEDL_MIM = installed_version('onedl-mim') is not None
MIM_MMDET = 'onedl-mmdetection' if installed_version('onedl-mmdetection') else 'mmdet'

pytestmark = pytest.mark.slow


@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
    """A folder with data/mini_coco and data/mini_ade, the configs' relative data roots."""
    d = tmp_path_factory.mktemp('e2e')
    run([PY, osp.join(ROOT, 'tools/misc/make_mini_dataset.py'), '--out', str(d / 'data')], d)
    return d


def metric(log, name):
    if 'results of the whole dataset is empty' in log:
        return 0.0  # mmdet's CocoMetric: no detection at all (an untrained model)
    found = re.findall(rf'{re.escape(name)}: (-?[0-9.]+)', log)
    assert found, f'{name} not in output:\n{log[-3000:]}'
    return float(found[-1])


def tool_metric(cfg, ckpt, workdir, out_dir, name):
    """Run tools/test.py on a checkpoint and return one metric from its output."""
    return metric(run([PY, osp.join(ROOT, 'tools/test.py'), cfg, str(ckpt), '--work-dir',
                       str(out_dir)], workdir), name)


def test_retinanet_train_resume_test(workdir):
    """tools/train.py, then `mim train mmsoft` resuming it, tools/test.py and `mim test`
    on the result, and fine-tuning from it (load_from)."""
    wd = workdir / 'det'
    opts = ['--cfg-options', 'default_hooks.checkpoint.interval=100',
            'train_cfg.val_interval=1000']
    mim = shutil.which('mim', path=osp.dirname(PY))
    # 1) train 100 of 200 iterations, as if the run had been stopped there
    run([PY, osp.join(ROOT, 'tools/train.py'), DET_CFG, '--work-dir', str(wd)] + opts +
        ['train_cfg.max_iters=100'], workdir)
    assert (wd / 'iter_100.pth').exists()
    # 2) resume from the latest checkpoint and finish at 200, through `mim train mmsoft`:
    #    mim finds mmsoft's train tool inside the installed package, and the config by its
    #    name there (onedl-mim 0.5.1 looks a name up by walking the whole project of an
    #    editable install, following mmsoft/.mim/configs -> configs and into work_dirs/,
    #    so a bare name is ambiguous there; docs/en/user_guides/train_test.md says to pass
    #    the path; openmim walks the installed package only)
    cfg = DET_CFG if ONEDL_MIM else osp.basename(DET_CFG)
    log = run([mim, 'train', 'mmsoft', cfg, '--work-dir', str(wd), '--resume'] + opts +
              ['train_cfg.max_iters=200'], workdir)
    assert re.search(r'Training command is \S*python\S* \S*mmsoft/\.mim/tools/train\.py',
                     log.replace(os.sep, '/')), log[:2000]
    assert 'resumed' in log.lower() and 'iter_100.pth' in log
    iters = [int(i) for i in re.findall(r'Iter\(train\) \[ *(\d+)/200\]', log)]
    assert iters and min(iters) > 100 and max(iters) == 200, iters
    ckpt = mmsoft_load(wd / 'iter_200.pth', map_location='cpu')  # weights_only stays on
    assert ckpt['meta']['iter'] == 200
    # 3) the trained model finds the objects; the untrained one does not (bbox mAP after
    #    200 iterations, 0.0 untrained; with the config's seed 0.29 with all threads and
    #    0.24 with OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 ATEN_CPU_CAPABILITY=default; seeds
    #    1, 2, 3 gave 0.13, 0.19, 0.18 (with the 256-channel head of before: 0.12-0.39):
    #    the bound leaves room for that spread, which says nothing about the code)
    trained = tool_metric(DET_CFG, wd / 'iter_200.pth', workdir, wd / 't',
                               'coco/bbox_mAP')
    init = untrained_checkpoint(DET_CFG, wd / 'untrained.pth')
    untrained = tool_metric(DET_CFG, init, workdir, wd / 'u', 'coco/bbox_mAP')
    assert trained > 0.08 and trained > untrained + 0.08, (trained, untrained)
    # 4) mmdet's own test tool, through `mim test mmdet` (onedl: onedl-mmdetection), loads
    #    the same checkpoint
    log = run([mim, 'test', MIM_MMDET, DET_CFG, '--checkpoint', str(wd / 'iter_200.pth'),
               '--work-dir', str(wd / 'mim')], workdir)
    assert re.search(r'Testing command is \S*python\S* \S*mmdet/\.mim/tools/test\.py',
                     log.replace(os.sep, '/')), log[:2000]
    assert metric(log, 'coco/bbox_mAP') == pytest.approx(trained, abs=1e-3)
    # 5) load_from: fine-tuning starts from the trained weights
    log = run([PY, osp.join(ROOT, 'tools/train.py'), DET_CFG, '--work-dir', str(wd / 'ft'),
               '--cfg-options', f'load_from={wd / "iter_200.pth"}', 'train_cfg.max_iters=2',
               'train_cfg.val_interval=1000'], workdir)
    assert 'Load checkpoint from' in log


def test_upernet_train_test(workdir):
    wd = workdir / 'seg'
    run([PY, osp.join(ROOT, 'tools/train.py'), SEG_CFG, '--work-dir', str(wd),
         '--cfg-options', 'train_cfg.max_iters=200', 'train_cfg.val_interval=1000',
         'default_hooks.checkpoint.interval=200'], workdir)
    trained = tool_metric(SEG_CFG, wd / 'iter_200.pth', workdir, wd / 't', 'mIoU')
    init = untrained_checkpoint(SEG_CFG, wd / 'untrained.pth')
    untrained = tool_metric(SEG_CFG, init, workdir, wd / 'u', 'mIoU')
    # mmseg reports mIoU in %: seeds 0-4 gave 47.3-50.2 after 200 iterations, untrained 11.8
    # (39.6-46.2 after 140, 31.9 after 100 with seed 0: the margin is kept, not spent)
    assert trained > untrained + 20, (trained, untrained)


def test_killed_training_resumes_to_the_same_weights(workdir):
    """SIGKILL after a checkpoint, then --resume: no iteration lost or repeated, and with a
    fixed seed and deterministic mode the final weights equal an uninterrupted run's
    (that run evaluates at its end)."""
    import signal
    import time
    opts = ['--cfg-options', 'randomness.seed=0', 'randomness.deterministic=True',
            'train_cfg.max_iters=16', 'train_cfg.val_interval=1000',
            'default_hooks.checkpoint.interval=8', 'default_hooks.logger.interval=1',
            'train_dataloader.num_workers=1']
    train = [PY, osp.join(ROOT, 'tools/train.py'), DET_CFG]
    full, cut = workdir / 'full', workdir / 'cut'
    log = run(train + ['--work-dir', str(full)] + opts, workdir)
    # the loop's last iteration is also a validation one: COCO's metric ran
    assert 0 <= metric(log, 'coco/bbox_mAP') <= 1

    proc = subprocess.Popen(train + ['--work-dir', str(cut)] + opts, cwd=workdir,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 600
    while not (cut / 'last_checkpoint').exists() and proc.poll() is None:
        assert time.time() < deadline, 'no checkpoint written'
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (cut / 'iter_8.pth').exists() and not (cut / 'iter_16.pth').exists()

    log = run(train + ['--work-dir', str(cut), '--resume'] + opts, workdir)
    iters = [int(i) for i in re.findall(r'Iter\(train\) \[ *(\d+)/16\]', log)]
    assert iters == list(range(9, 17)), iters
    a = mmsoft_load(full / 'iter_16.pth', map_location='cpu')
    b = mmsoft_load(cut / 'iter_16.pth', map_location='cpu')
    for k, v in a['state_dict'].items():
        assert torch.allclose(v.float(), b['state_dict'][k].float(), rtol=0, atol=1e-6), k
    assert a['message_hub']['runtime_info']['iter'] == b['message_hub']['runtime_info']['iter']
