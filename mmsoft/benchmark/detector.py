"""What a detection user sees: one training iteration (data → backbone → neck → head →
losses → backward → optimizer step, batch ``--train-batch``) and one test forward per
image of RetinaNet and Mask R-CNN from the shipped SOFT-S configs (the paper's, and the
fast mode ``landmark_grid=16``; on CUDA also the paper's with ``cuda_graphs``), and of
the paper's configs with Swin-T as the backbone, at ``--detector-size``: the ratio of
mmengine's ``time:`` column (needs mmcv's compiled ops).
"""
import logging
import time

import numpy as np
import torch

from .common import fmt, parse_size, repo_file, sync

# The shipped SOFT-S detector configs per detector and backbone label (relative to the
# repository root, or to mmsoft/.mim in an installed package): 'SOFT-S' the paper's
# (landmarks growing with the image), 'SOFT-S [grid16]' the same config with the fast mode
# landmark_grid=16 (at most 16×16 landmarks per head). Swin-T replaces only the backbone of
# the 'SOFT-S' config (and the neck's input widths), so neck, head, losses and optimizer
# are the same for all three. The labels key the rows of the JSON ('RetinaNet SOFT-S
# [grid16]'), as the other sections label SOFT-S's modes.
DETECTOR_CONFIGS = {
    'RetinaNet': {'SOFT-S': 'configs/soft/retinanet_soft-s_fpn_1x_coco.py',
                  'SOFT-S [grid16]': 'configs/soft/retinanet_soft-s-grid16_fpn_1x_coco.py'},
    'Mask R-CNN': {'SOFT-S': 'configs/soft/mask-rcnn_soft-s_fpn_1x_coco.py',
                   'SOFT-S [grid16]': 'configs/soft/mask-rcnn_soft-s-grid16_fpn_1x_coco.py'},
}
DETECTOR_BACKBONES = ('SOFT-S', 'SOFT-S [grid16]', 'SOFT-S [cuda graphs]', 'Swin-T')
# rows per detector, in order; 'SOFT-S [cuda graphs]' ('SOFT-S' with its stages replayed
# from CUDA graphs, captured at the first call) on CUDA only
CUDA_ONLY_BACKBONES = ('SOFT-S [cuda graphs]', )
SWIN_T_WIDTHS = (96, 192, 384, 768)


def detector_config(detector, backbone):
    """The config of ``detector`` ('RetinaNet', 'Mask R-CNN') with ``backbone`` ('SOFT-S'
    or 'SOFT-S [grid16]' as shipped, 'SOFT-S [cuda graphs]': 'SOFT-S' with its stages
    replayed from CUDA graphs, captured at the first call, or 'Swin-T': mmdet's
    SwinTransformer at the 'SOFT-S' config's output stages and drop path rate, the
    neck's ``in_channels`` set to its widths)."""
    from mmengine.config import Config
    if backbone not in DETECTOR_BACKBONES:
        raise ValueError(f'backbone must be one of {DETECTOR_BACKBONES}, got {backbone!r}')
    configs = DETECTOR_CONFIGS[detector]
    cfg = Config.fromfile(repo_file(configs.get(backbone, configs['SOFT-S']), mim=True))
    if backbone == 'SOFT-S [cuda graphs]':
        cfg.model.backbone.cuda_graphs = dict(min_calls=1)
    if backbone == 'Swin-T':
        soft = cfg.model.backbone
        cfg.model.backbone = dict(type='SwinTransformer', out_indices=soft.out_indices,
                                  drop_path_rate=soft.drop_path_rate, convert_weights=False)
        cfg.model.neck.in_channels = [SWIN_T_WIDTHS[i] for i in soft.out_indices]
    return cfg


def detector_batch(hw, batch, masks, seed=0):
    """A packed batch as mmdet's pipeline gives it to ``train_step``: ``batch`` uint8 images
    of ``hw`` (already resized) with 8 ground-truth boxes each (and box-shaped masks)."""
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData
    g = torch.Generator().manual_seed(seed)
    H, W = hw
    inputs, samples = [], []
    for _ in range(batch):
        inputs.append(torch.randint(0, 256, (3, H, W), generator=g, dtype=torch.uint8))
        xy = torch.rand(8, 2, generator=g) * torch.tensor([W * 0.7, H * 0.7])
        wh = (0.1 + 0.2 * torch.rand(8, 2, generator=g)) * torch.tensor([W, H])
        boxes = torch.cat([xy, xy + wh], 1)
        gt = InstanceData(bboxes=boxes, labels=torch.randint(0, 80, (8, ), generator=g))
        if masks:
            m = np.zeros((8, H, W), dtype=np.uint8)
            for k, (x0, y0, x1, y1) in enumerate(boxes.round().int().tolist()):
                m[k, y0:y1, x0:x1] = 1
            gt.masks = BitmapMasks(m, H, W)
        sample = DetDataSample(metainfo=dict(img_shape=hw, ori_shape=hw, pad_shape=hw,
                                             scale_factor=(1., 1.), flip=False))
        sample.gt_instances = gt
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def _detector_step(model, optim_wrapper, data, device, train):
    """Seconds of one ``train_step`` (with the optimizer step) or, with ``train`` False,
    of one ``test_step``; peak CUDA memory (bytes) of the call, None off CUDA."""
    model.train(train)
    if device == 'cuda':
        torch.cuda.reset_peak_memory_stats()
    sync(device)
    t0 = time.perf_counter()
    if train:
        model.train_step(data, optim_wrapper)
    else:
        with torch.no_grad():
            model.test_step(data)
    sync(device)
    seconds = time.perf_counter() - t0
    return seconds, torch.cuda.max_memory_allocated() if device == 'cuda' else None


def section_detector(args, out):
    """One training iteration (data → backbone → neck → head → losses → backward →
    optimizer step) at ``--train-batch`` images and one test-time forward per image, of
    RetinaNet and Mask R-CNN with SOFT-S (the paper's and ``landmark_grid=16``) and with
    Swin-T, all in turn for ``--rounds`` rounds (medians); each SOFT-S row's ratio to the
    same detector with Swin-T is what mmengine's ``time:`` column shows."""
    from mmengine.logging import MMLogger
    from mmengine.optim import build_optim_wrapper

    from mmsoft.apis import init_model
    hw = parse_size(args.detector_size)
    b = args.train_batch
    backbones = [n for n in DETECTOR_BACKBONES
                 if n not in CUDA_ONLY_BACKBONES or args.device == 'cuda']
    models = {}
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.WARNING)  # not a line per parameter group
    try:
        for det in DETECTOR_CONFIGS:
            for backbone in backbones:
                cfg = detector_config(det, backbone)
                torch.manual_seed(0)
                model = init_model(cfg).to(args.device)
                models[det, backbone] = (model, build_optim_wrapper(model, cfg.optim_wrapper))
    finally:
        logger.setLevel(level)
    times = {}  # (det, backbone, step) -> [seconds]
    peaks = {}
    for _ in range(args.rounds):
        for (det, backbone), (model, optim) in models.items():
            for step, train in (('train', True), ('test', False)):
                runs = []
                for i in range(max(args.repeat, 1) + 1):  # the first run warms up
                    if train:
                        data = detector_batch(hw, b, masks=det == 'Mask R-CNN', seed=i)
                    else:
                        data = detector_batch(hw, 1, masks=False, seed=i)
                    sec, peak = _detector_step(model, optim, data, args.device, train)
                    if i:
                        runs.append(sec)
                        if peak is not None:
                            peaks[det, backbone, step] = max(
                                peak, peaks.get((det, backbone, step), 0))
                times.setdefault((det, backbone, step), []).extend(runs)
    med = {k: float(np.median(v)) for k, v in times.items()}
    rows = {}
    lines = [f'Images of {args.detector_size} (H×W, as resized by the pipeline; padded to '
             f'multiples of 32), {args.device}; training iteration at batch {b} with the '
             'optimizer step, test forward at batch 1. SOFT-S [grid16]: the fast mode '
             'landmark_grid=16 (at most 16×16 landmarks per head).', '',
             '| detector | backbone | train iteration | vs Swin-T | test forward | vs Swin-T |'
             + (' peak train memory | vs Swin-T |' if peaks else ''),
             '|---|---|---|---|---|---|' + ('---|---|' if peaks else '')]
    for det in DETECTOR_CONFIGS:
        for backbone in backbones:
            r = {step: med[det, backbone, step] for step in ('train', 'test')}
            base = {step: med[det, 'Swin-T', step] for step in ('train', 'test')}
            line = (f'| {det} | {backbone} | {fmt(r["train"])} | '
                    f'{r["train"] / base["train"]:.2f}× | {fmt(r["test"])} | '
                    f'{r["test"] / base["test"]:.2f}× |')
            if peaks:
                p, pb = peaks[det, backbone, 'train'], peaks[det, 'Swin-T', 'train']
                r['train peak bytes'] = p
                line += f' {p / 2**30:.2f} GiB | {p / pb:.2f}× |'
            rows[f'{det} {backbone}'] = r
            lines.append(line)
    out['detector'] = rows
    return lines
