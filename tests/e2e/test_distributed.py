"""Two processes on the CPU (torchrun, gloo) against one process with the same total batch.

RetinaNet divides each rank's losses by that rank's own number of positive anchors, and
DDP averages the ranks' gradients; so 2 ranks × 2 images equal 1 process × 4 images
exactly only when both ranks hold the same number of positives. The images here differ in
content (background, shape, colour, class) but all put their object in the same box,
which makes the positive-anchor count the same for every image. BatchNorm is frozen
(``norm_eval=True``): torch's SyncBatchNorm needs a GPU. Slow (about a minute).
"""
import json
import os
import os.path as osp
import socket
import sys

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from mmsoft.checkpoint import load as mmsoft_load
from conftest import ROOT, run, untrained_checkpoint

PY = sys.executable
MINI_CFG = osp.join(ROOT, 'configs/_mini_/retinanet_soft-t_fpn_mini-coco.py')
BOX = (28, 36, 92, 100)  # x1, y1, x2, y2 of the one object in every image

pytestmark = pytest.mark.slow


def make_same_box_set(root, n=4, size=128):
    os.makedirs(osp.join(root, 'img'), exist_ok=True)
    rng = np.random.default_rng(0)
    images, anns = [], []
    for i in range(n):
        bg = rng.integers(0, 256, 3)
        arr = np.clip(bg + rng.normal(0, 30, (size, size, 3)), 0, 255).astype(np.uint8)
        img = Image.fromarray(arr)
        draw = ImageDraw.Draw(img)
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.rectangle if i % 2 == 0 else draw.ellipse)(BOX, fill=colour)
        name = f'{i}.png'
        img.save(osp.join(root, 'img', name))
        images.append(dict(id=i, file_name=name, width=size, height=size))
        x1, y1, x2, y2 = BOX
        anns.append(dict(id=i, image_id=i, category_id=i % 2, bbox=[x1, y1, x2 - x1, y2 - y1],
                         area=(x2 - x1) * (y2 - y1), iscrowd=0))
    cats = [dict(id=0, name='rectangle'), dict(id=1, name='ellipse')]
    with open(osp.join(root, 'ann.json'), 'w') as f:
        json.dump(dict(images=images, annotations=anns, categories=cats), f)


SGD = ("optim_wrapper = dict(_delete_=True, type='OptimWrapper', optimizer=dict("
       "type='SGD', lr=0.01, momentum=0.9, weight_decay=1e-4), "
       "clip_grad=dict(max_norm=1.0, norm_type=2))")


def write_config(path, data_root, load_from, iters, extra=''):
    cfg = f"""
_base_ = {MINI_CFG!r}
model = dict(backbone=dict(norm_eval=True))
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='Resize', scale=(128, 128), keep_ratio=True),
    dict(type='PackDetInputs')
]
train_dataloader = dict(
    batch_size=4, num_workers=0, persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(data_root={data_root!r}, ann_file='ann.json', data_prefix=dict(img='img/'),
                 pipeline=train_pipeline))
val_dataloader = None
val_cfg = None
val_evaluator = None
test_dataloader = None
test_cfg = None
test_evaluator = None
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters={iters})
default_hooks = dict(checkpoint=dict(by_epoch=False, interval={iters}),
                     logger=dict(interval=1))
randomness = dict(seed=0, deterministic=True)
load_from = {load_from!r}
{extra}
"""
    with open(path, 'w') as f:
        f.write(cfg)
    return str(path)


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


@pytest.fixture(scope='module')
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp('dist')
    make_same_box_set(str(d / 'data'))
    return d, untrained_checkpoint(MINI_CFG, d / 'init.pth')


def weights(path):
    return mmsoft_load(path, map_location='cpu')['state_dict']


@pytest.mark.parametrize('optimizer', ['sgd', 'adamw'])
def test_two_cpu_processes_match_one_process(setup, optimizer):
    d, init = setup
    iters = 3
    cfg = write_config(d / f'cfg_{optimizer}.py', str(d / 'data'), init, iters,
                       SGD if optimizer == 'sgd' else '')
    single, multi = d / f'single_{optimizer}', d / f'dist_{optimizer}'
    run([PY, osp.join(ROOT, 'tools/train.py'), cfg, '--work-dir', str(single)], d)
    env = dict(PATH=osp.dirname(PY) + os.pathsep + os.environ.get('PATH', ''),
               PORT=str(free_port()), OMP_NUM_THREADS='1')
    log = run(['bash', osp.join(ROOT, 'tools/dist_train.sh'), cfg, '2', '--work-dir',
               str(multi), '--cfg-options', 'train_dataloader.batch_size=2'], d, env)
    assert 'Distributed training is not used' not in log
    one = weights(single / f'iter_{iters}.pth')
    two = weights(multi / f'iter_{iters}.pth')
    start = weights(init)
    assert one.keys() == two.keys()
    diff = {k: (one[k].float() - two[k].float()).abs().max().item() for k in one}
    moved = {k: (one[k].float() - start[k].float()).abs().max().item() for k in one}
    assert max(moved.values()) > 1e-5  # the weights did move (AdamW warm-up: ~3e-5)
    if optimizer == 'sgd':
        # Steps are proportional to the gradients: every weight agrees to rounding.
        bad = {k: (diff[k], moved[k]) for k in one if diff[k] > 1e-6 + 1e-4 * moved[k]}
        assert not bad, bad
    else:
        # Adam's first steps are ±lr for any gradient above eps, so the few weights whose
        # gradient is at rounding level may step either way; the update as a whole agrees.
        num = sum(((one[k].float() - two[k].float())**2).sum() for k in one).sqrt()
        den = sum(((one[k].float() - start[k].float())**2).sum() for k in one).sqrt()
        assert num / den < 0.02, (num / den).item()
    # BatchNorm running statistics stayed frozen (norm_eval) in both runs
    bn = [k for k in one if k.endswith('running_mean')]
    assert bn and all(torch.equal(one[k], start[k]) and torch.equal(two[k], start[k])
                      for k in bn)


def test_syncbn_config_runs_single_process_on_cpu(setup):
    """mmengine reverts SyncBN to BN when not distributed, so SyncBN configs train here."""
    d, init = setup
    cfg = write_config(d / 'cfg_syncbn.py', str(d / 'data'), init, 1)
    log = run([PY, osp.join(ROOT, 'tools/train.py'), cfg, '--work-dir', str(d / 'syncbn'),
               '--cfg-options', 'model.backbone.norm_cfg.type=SyncBN',
               'model.backbone.norm_eval=False'], d)
    assert 'will be automatically reverted to BatchNormXd' in log
    assert osp.exists(d / 'syncbn' / 'iter_1.pth')
