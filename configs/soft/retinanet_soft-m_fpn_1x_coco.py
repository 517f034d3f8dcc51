# RetinaNet, SOFT-Medium, COCO 1x (paper recipe). Paper: 44.3 box AP, 55M params.
_base_ = './retinanet_soft-t_fpn_1x_coco.py'

pretrained = 'checkpoints/soft_medium_norm.pth'  # SOFT-Medium-Norm: see ../_base_/models/soft-s.py

model = dict(
    backbone=dict(arch='medium', drop_path_rate=0.2, init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[128, 288, 512]))
