"""Every shipped config builds, initializes, trains one step, predicts, and has the
parameter count of the paper it reproduces; no block of settings is typed in two configs."""
import collections
import glob
import os.path as osp
import re

import pytest
import torch
from mmengine.config import Config
from conftest import ROOT

CONFIGS = sorted(
    p for p in glob.glob(osp.join(ROOT, 'configs', '**', '*.py'), recursive=True)
    if '_base_' not in p)

# Parameter counts (millions) reported by the papers: the SOFT paper's COCO, ADE20K and
# ImageNet tables, the SimA paper's COCO table.
PAPER_PARAMS = {
    'retinanet_soft-t_fpn_1x_coco.py': 23,
    'retinanet_soft-s_fpn_1x_coco.py': 34,
    'retinanet_soft-m_fpn_1x_coco.py': 55,
    'retinanet_soft-l_fpn_1x_coco.py': 74,
    'mask-rcnn_soft-t_fpn_1x_coco.py': 33,
    'mask-rcnn_soft-s_fpn_1x_coco.py': 44,
    'mask-rcnn_soft-m_fpn_1x_coco.py': 65,
    'mask-rcnn_soft-l_fpn_1x_coco.py': 84,
    'mask-rcnn_soft-s_fpn_ms-3x_coco.py': 44,
    'cascade-mask-rcnn_soft-s_fpn_ms-3x_coco.py': 77,
    'atss_soft-s_fpn_1x_coco.py': 32,
    'gfl_soft-s_fpn_ms-2x_coco.py': 32,
    'sparse-rcnn_soft-s_fpn_300-proposals_crop-ms-480-800-3x_coco.py': 106,
    'upernet_soft-s_8xb2-160k_ade20k-512x512.py': 54,
    'upernet_soft-m_8xb2-160k_ade20k-512x512.py': 76,
    # the paper's models with landmark_grid=16, which adds or removes no parameter
    'retinanet_soft-s-grid16_fpn_1x_coco.py': 34,
    'mask-rcnn_soft-s-grid16_fpn_1x_coco.py': 44,
    'upernet_soft-s-grid16_8xb2-160k_ade20k-512x512.py': 54,
    'mask-rcnn_xcit-sima-s12-p16_fpn_ms-crop-3x_coco.py': 44.3,
    'soft-tiny_8xb128_in1k.py': 13,
    'soft-small_8xb128_in1k.py': 24,
    'soft-medium_8xb128_in1k.py': 45,
}


def config_id(path):
    return osp.relpath(path, osp.join(ROOT, 'configs'))


def build_model(cfg):
    from mmsoft.apis import init_model
    return init_model(cfg)


def det_batch(model, num_classes, with_mask, h=128, w=160):
    from mmdet.testing import demo_mm_inputs
    packed = demo_mm_inputs(batch_size=2, image_shapes=[(3, h, w), (3, h - 32, w + 16)],
                            num_items=[3, 2], num_classes=num_classes, with_mask=with_mask)
    return packed


def seg_batch(num_classes, h=128, w=128):
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    inputs, samples = [], []
    for _ in range(2):
        inputs.append(torch.randint(0, 255, (3, h, w), dtype=torch.uint8))
        s = SegDataSample()
        s.gt_sem_seg = PixelData(data=torch.randint(0, num_classes, (1, h, w)))
        s.set_metainfo(dict(img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w)))
        samples.append(s)
    return dict(inputs=inputs, data_samples=samples)


def cls_batch(num_classes, h=96, w=96):
    from mmpretrain.structures import DataSample
    inputs = [torch.randint(0, 255, (3, h, w), dtype=torch.uint8) for _ in range(2)]
    samples = [DataSample().set_gt_label(torch.randint(0, num_classes, (1, )))
               for _ in range(2)]
    return dict(inputs=inputs, data_samples=samples)


@pytest.mark.parametrize('path', CONFIGS, ids=config_id)
def test_config_builds_trains_and_predicts(path):
    cfg = Config.fromfile(path)
    assert cfg.custom_imports == dict(imports=['mmsoft'], allow_failed_imports=False)
    if '_mini_' not in path and cfg.default_scope != 'mmpretrain':  # pre-training starts cold
        assert cfg.model.backbone.init_cfg['type'] == 'Pretrained'
    model = build_model(cfg)

    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    name = osp.basename(path)
    if name in PAPER_PARAMS:
        ref = PAPER_PARAMS[name]
        assert abs(n_params - ref) / ref < 0.02, f'{name}: {n_params:.2f}M vs paper {ref}M'

    scope = cfg.default_scope
    if scope == 'mmdet':
        with_mask = 'roi_head' in cfg.model and 'mask_head' in cfg.model.roi_head
        num_classes = 80 if '_mini_' not in path else 2
        data = det_batch(model, num_classes, with_mask)
    elif scope == 'mmseg':
        # the shipped preprocessor pads training crops to 512²; a CPU step at 128² suffices
        model.data_preprocessor.size = (128, 128)
        data = seg_batch(cfg.model.decode_head.num_classes)
    else:
        data = cls_batch(cfg.model.head.num_classes)

    model.train()
    batch = model.data_preprocessor(data, True)
    losses = model(**batch, mode='loss')
    loss, _ = model.parse_losses(losses)
    assert torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in model.backbone.parameters() if p.requires_grad]
    assert any(g is not None and g.abs().sum() > 0 for g in grads)
    unused = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not unused, f'parameters without gradient (DDP would fail): {unused[:5]}'

    model.eval()
    with torch.no_grad():
        batch = model.data_preprocessor(data, False)
        preds = model(**batch, mode='predict')
    assert len(preds) == 2


# The fast-mode configs: the paper's SOFT-S config beside them with landmark_grid=16 only.
GRID16 = {
    'retinanet_soft-s-grid16_fpn_1x_coco.py': 'retinanet_soft-s_fpn_1x_coco.py',
    'mask-rcnn_soft-s-grid16_fpn_1x_coco.py': 'mask-rcnn_soft-s_fpn_1x_coco.py',
    'upernet_soft-s-grid16_8xb2-160k_ade20k-512x512.py':
        'upernet_soft-s_8xb2-160k_ade20k-512x512.py',
}


def test_grid16_configs_are_listed():
    shipped = {osp.basename(p) for p in CONFIGS if 'grid16' in p}
    assert shipped == set(GRID16)


@pytest.mark.parametrize('grid,exact', GRID16.items(), ids=list(GRID16))
def test_grid16_config_bounds_only_the_landmarks(grid, exact):
    """The config is its exact sibling but for landmark_grid=16; at 800×1344 each SOFT
    layer of stages 1-3 attends through 16×16 landmarks instead of the paper's one per
    r×r window of its tokens (⌊200/8⌋·⌊336/8⌋ = 25·42, also at strides 8 and 16 with
    r = 4 and 2)."""
    from mmsoft.apis import init_backbone
    from mmsoft.models.backbones.soft import SoftKernelAttention
    grid_cfg, exact_cfg = (Config.fromfile(osp.join(ROOT, 'configs', 'soft', name))
                           for name in (grid, exact))
    assert grid_cfg.model.backbone.pop('landmark_grid') == 16
    assert grid_cfg.to_dict() == exact_cfg.to_dict()

    counts = {}
    for name in (grid, exact):
        backbone = init_backbone(config=osp.join(ROOT, 'configs', 'soft', name))
        layers = [m for m in backbone.modules() if isinstance(m, SoftKernelAttention)]
        assert sorted({m.sr_ratio for m in layers}) == [2, 4, 8]
        m = set()
        for layer in layers:
            stride = {8: 4, 4: 8, 2: 16}[layer.sr_ratio]
            hw = (800 // stride, 1344 // stride)
            d = layer.Qlandmark_op.in_channels
            q = torch.randn(1, 1, hw[0] * hw[1], d)
            with torch.no_grad():
                m.add(layer.landmarks(q, hw).shape[-2])
        counts[name] = m
    assert counts == {grid: {16 * 16}, exact: {25 * 42}}


# ---------------------------------------------------------------- one source per block

# Six lines typed alike in two configs make a block that belongs in a shared _base_ file.
REPEAT_LINES = 6
# Lines of nothing but brackets and commas (``)``, ``],``, ``]``) are left out: every config
# closes its dicts and lists alike, and counting them would join short, different blocks
# into one run that looks repeated. Blank lines are left out too, and indentation and
# trailing whitespace are ignored, so a copy re-indented or re-spaced is still found.
NO_CONTENT = re.compile(r'[\s()\[\]{},]*')


def repeated_blocks(paths, run=REPEAT_LINES):
    """Runs of ``run`` consecutive lines with content that more than one of ``paths``
    holds: ``[(lines, [(path, line number of the run's first line), ...]), ...]``."""
    where = collections.defaultdict(list)
    for path in paths:
        with open(path, encoding='utf-8') as f:
            lines = [(number, line.strip()) for number, line in enumerate(f, 1)
                     if not NO_CONTENT.fullmatch(line.strip())]
        for i in range(len(lines) - run + 1):
            where[tuple(text for _, text in lines[i:i + run])].append((path, lines[i][0]))
    return [(block, places) for block, places in where.items()
            if len({path for path, _ in places}) > 1]


def test_no_block_is_typed_in_two_configs():
    paths = sorted(glob.glob(osp.join(ROOT, 'configs', '**', '*.py'), recursive=True))
    repeats = repeated_blocks(paths)
    report = [' and '.join(f'{config_id(path)}:{number}' for path, number in places) + ':\n    '
              + '\n    '.join(block) for block, places in repeats[:5]]
    assert not repeats, (f'{len(repeats)} runs of {REPEAT_LINES} lines are typed in more than '
                         'one config; share them through a _base_ file:\n' + '\n'.join(report))


def test_repeated_blocks_are_found(tmp_path):
    block = ['model = dict(', '    backbone=dict(', "        type='SOFT',", "        arch='small',",
             '        drop_path_rate=0.1,', '    ),', '', "    neck=dict(in_channels=[1]))"]
    one, two, three = tmp_path / 'one.py', tmp_path / 'two.py', tmp_path / 'three.py'
    one.write_text('\n'.join(['# one'] + block) + '\n')
    # the same six lines with content, re-indented, with other blank and bracket lines
    two.write_text('\n'.join(['x = 1', ''] + [line.strip() + '  ' for line in block[:5]]
                             + ['', ')', '', block[7]]) + '\n')
    three.write_text('\n'.join(block[:5] + ['    drop_path_rate=0.2,']) + '\n')  # five alike
    found = repeated_blocks([str(one), str(two), str(three)])
    assert [places for _, places in found] == [[(str(one), 2), (str(two), 3)]]
    assert repeated_blocks([str(one), str(three)]) == []
