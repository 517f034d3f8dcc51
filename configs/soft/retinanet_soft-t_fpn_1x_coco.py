# RetinaNet with a SOFT-Tiny backbone, COCO, 1x schedule (12 epochs).
# Recipe: the SOFT paper's (AdamW lr 1e-4, weight decay 0.01 in adamw.py; batch 16 = 8 x 2
# images, short side 800 / long side <= 1333). Paper: 40.0 box AP, 23M params.
_base_ = [
    'mmdet::_base_/models/retinanet_r50_fpn.py',
    'mmdet::_base_/datasets/coco_detection.py',
    '../_base_/schedules/adamw_1x.py', 'mmdet::_base_/default_runtime.py',
    '../_base_/models/soft-s.py'
]

pretrained = 'checkpoints/soft_tiny_norm.pth'  # SOFT-Tiny-Norm: see ../_base_/models/soft-s.py

model = dict(
    backbone=dict(
        _base_.soft_s,
        _delete_=True,
        arch='tiny',
        out_indices=(1, 2, 3),  # only the stages the FPN uses (start_level=1)
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[128, 320, 512], start_level=0, num_outs=5))
