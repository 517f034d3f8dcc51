# RetinaNet, SOFT-Small, COCO 1x (paper recipe). Paper: 42.8 box AP, 34M params.
_base_ = './retinanet_soft-t_fpn_1x_coco.py'

pretrained = 'checkpoints/soft_small_norm.pth'  # SOFT-Small-Norm: see ../_base_/models/soft-s.py

model = dict(backbone=dict(arch='small', init_cfg=dict(checkpoint=pretrained)))
