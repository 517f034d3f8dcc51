# RetinaNet, SOFT-Small, COCO 1x (paper recipe). Paper: 42.8 box AP, 34M params.
_base_ = './retinanet_soft-t_fpn_1x_coco.py'

# Official ImageNet SOFT-Small-Norm weights (timm format, loaded as they are): download
# them from the links in https://github.com/fudan-zvg/SOFT (README, ImageNet table;
# Google Drive) to checkpoints/soft_small_norm.pth, or point this at your copy.
pretrained = 'checkpoints/soft_small_norm.pth'

model = dict(backbone=dict(arch='small', init_cfg=dict(checkpoint=pretrained)))
