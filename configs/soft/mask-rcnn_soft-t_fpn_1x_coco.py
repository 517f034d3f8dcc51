# Mask R-CNN with a SOFT-Tiny backbone, COCO, 1x schedule (12 epochs).
# Recipe: the SOFT paper's (AdamW lr 1e-4, weight decay 0.01 in adamw.py; batch 16 = 8 x 2
# images, short side 800 / long side <= 1333). Paper: 41.2 box / 38.2 mask AP, 33M params.
_base_ = [
    '../_base_/models/mask-rcnn_soft-s_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    '../_base_/schedules/adamw_1x.py', 'mmdet::_base_/default_runtime.py'
]

pretrained = 'checkpoints/soft_tiny_norm.pth'  # SOFT-Tiny-Norm: see ../_base_/models/soft-s.py

model = dict(backbone=dict(arch='tiny', init_cfg=dict(checkpoint=pretrained)))
