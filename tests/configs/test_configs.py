"""Every shipped config builds, initializes and has the parameter count of the paper it
reproduces; one config of each family (a detector, segmentor or classifier head with a
backbone family) trains one step and predicts, and every other one's backbone feeds its
neck (or head) in a forward and backward pass; no block of settings is typed in two
configs."""
import collections
import functools
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


# One config per family trains a step and predicts: each head type of each codebase with
# each backbone family, the smallest model of it. The other configs of a family differ
# from it in the backbone's arch and the neck's input widths, which
# test_config_builds_and_feeds_its_neck checks, and in the data pipeline and the
# schedule, which a training step on random inputs does not read. The grid16 configs are
# their paper sibling with
# landmark_grid=16, which bounds the landmarks only above 16 per side, far beyond these
# inputs (test_grid16_bounds_only_the_landmarks).
STEP_CONFIGS = [osp.join(ROOT, 'configs', p) for p in (
    '_mini_/retinanet_soft-t_fpn_mini-coco.py',
    '_mini_/upernet_soft-t_mini-ade.py',
    'mmpretrain/soft-tiny_8xb128_in1k.py',
    'mmpretrain/xcit-sima-s12-p16_8xb128_in1k.py',
    'soft/atss_soft-s_fpn_1x_coco.py',
    'soft/cascade-mask-rcnn_soft-s_fpn_ms-3x_coco.py',
    'soft/gfl_soft-s_fpn_ms-2x_coco.py',
    'soft/mask-rcnn_soft-t_fpn_1x_coco.py',
    'soft/retinanet_soft-t_fpn_1x_coco.py',
    'soft/sparse-rcnn_soft-s_fpn_300-proposals_crop-ms-480-800-3x_coco.py',
    'soft/upernet_soft-s_8xb2-160k_ade20k-512x512.py',
    'xcit_sima/mask-rcnn_xcit-sima-t12-p16_fpn_ms-crop-3x_coco.py',
    'xcit_sima/upernet_xcit-sima-s12-p16_8xb2-160k_ade20k-512x512.py',
)]


@functools.lru_cache(maxsize=None)
def family(path):
    """(codebase, detector / segmentor / classifier type, head type, backbone type)."""
    cfg = Config.fromfile(path)
    model = cfg.model
    head = (model.get('roi_head') or model.get('bbox_head') or model.get('decode_head')
            or model.get('head'))
    return cfg.default_scope, model.type, head.type, model.backbone.type


def test_one_config_of_each_family_trains():
    assert set(STEP_CONFIGS) <= set(CONFIGS)
    families = {family(p) for p in CONFIGS}
    assert {family(p) for p in STEP_CONFIGS} == families
    assert len(STEP_CONFIGS) - 2 == len(families)  # the two mini configs: a family's again


def unused_parameters(model):
    return [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]


def built(path):
    """The config and its model, built as the tools build it; what the config says of
    itself checked: mmsoft imported, the ImageNet checkpoint, the paper's parameter count
    (within 2 %)."""
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
    return cfg, model


@pytest.mark.parametrize('path', [p for p in CONFIGS if p not in STEP_CONFIGS], ids=config_id)
def test_config_builds_and_feeds_its_neck(path):
    """The configs that do not train a step below: built (``built``); the backbone's maps
    go through the neck (detectors), the decode head (segmentors) or the head
    (classifiers) at a small odd size, and a backward pass from there reaches every
    parameter of those parts (one that none reaches makes DDP fail)."""
    cfg, model = built(path)
    model.train()
    x = torch.randn(2, 3, 96, 80)  # two images: BatchNorm in training mode needs them
    if cfg.default_scope == 'mmdet':
        parts, outs = ('backbone', 'neck'), model.extract_feat(x)
        assert len(outs) == cfg.model.neck.num_outs
        assert all(o.shape[1] == cfg.model.neck.out_channels for o in outs)
    elif cfg.default_scope == 'mmseg':
        parts, outs = ('backbone', 'decode_head'), [model._forward(x)]
        assert outs[0].shape[:2] == (2, cfg.model.decode_head.num_classes)
    else:
        parts, outs = ('backbone', 'neck', 'head'), [model(x, mode='tensor')]
        assert outs[0].shape == (2, cfg.model.head.num_classes)
    sum(o.float().mean() for o in outs).backward()
    unused = [n for n in unused_parameters(model) if n.split('.')[0] in parts]
    assert not unused, f'parameters without gradient (DDP would fail): {unused[:5]}'


@pytest.mark.parametrize('path', STEP_CONFIGS, ids=config_id)
def test_config_trains_and_predicts(path):
    """Built (``built``); one training step from the model's own losses (every parameter
    gets a gradient) and one prediction, on the codebase's own data structures."""
    cfg, model = built(path)
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
    unused = unused_parameters(model)
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
def test_grid16_config_is_its_paper_sibling_with_landmark_grid(grid, exact):
    grid_cfg, exact_cfg = (Config.fromfile(osp.join(ROOT, 'configs', 'soft', name))
                           for name in (grid, exact))
    assert grid_cfg.model.backbone.pop('landmark_grid') == 16
    assert grid_cfg.to_dict() == exact_cfg.to_dict()


def test_grid16_bounds_only_the_landmarks():
    """At 800×1344 each SOFT layer of stages 1-3 attends through 16×16 landmarks instead of
    the paper's one per r×r window of its tokens (⌊200/8⌋·⌊336/8⌋ = 25·42, also at strides
    8 and 16 with r = 4 and 2); once per backbone that the grid16 configs and their
    siblings build (two: the previous test shows each config is its sibling but for
    landmark_grid)."""
    from mmsoft.apis import init_backbone
    from mmsoft.models.backbones.soft import SoftKernelAttention
    backbones = {}
    for grid, exact in GRID16.items():
        for name in (grid, exact):
            path = osp.join(ROOT, 'configs', 'soft', name)
            backbone = Config.fromfile(path).model.backbone.to_dict()
            backbone.pop('out_indices')  # which maps it returns, not how it computes them
            backbones.setdefault(repr(backbone), (name, path))
    counts = {}
    for name, path in backbones.values():
        backbone = init_backbone(config=path)
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
    assert len(counts) == 2  # one grid16 backbone, one paper backbone
    assert {frozenset(m) for m in counts.values()} == {frozenset({16 * 16}),
                                                       frozenset({25 * 42})}
    assert all(counts[n] == {16 * 16} for n in counts if n in GRID16)


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
