# Mask R-CNN, SOFT-Large, COCO 1x (paper recipe). Paper: 47.0 box / 42.2 mask AP, 84M.
_base_ = './mask-rcnn_soft-t_fpn_1x_coco.py'

pretrained = 'checkpoints/soft_large_norm.pth'  # SOFT-Large-Norm: see ../_base_/models/soft-s.py

model = dict(
    backbone=dict(arch='large', drop_path_rate=0.3, init_cfg=dict(checkpoint=pretrained)))
