# Mask R-CNN, SOFT-Small, COCO 1x (paper recipe). Paper: 43.8 box / 40.1 mask AP, 44M.
_base_ = './mask-rcnn_soft-t_fpn_1x_coco.py'

pretrained = 'checkpoints/soft_small_norm.pth'  # SOFT-Small-Norm: see ../_base_/models/soft-s.py

model = dict(backbone=dict(arch='small', init_cfg=dict(checkpoint=pretrained)))
