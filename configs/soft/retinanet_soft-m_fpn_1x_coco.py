# RetinaNet, SOFT-Medium, COCO 1x (paper recipe). Paper: 44.3 box AP, 55M params.
_base_ = './retinanet_soft-t_fpn_1x_coco.py'

# Official ImageNet SOFT-Medium-Norm weights (timm format, loaded as they are): download
# them from the links in https://github.com/fudan-zvg/SOFT (README, ImageNet table;
# Google Drive) to checkpoints/soft_medium_norm.pth, or point this at your copy.
pretrained = 'checkpoints/soft_medium_norm.pth'

model = dict(
    backbone=dict(arch='medium', drop_path_rate=0.2, init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[128, 288, 512]))
