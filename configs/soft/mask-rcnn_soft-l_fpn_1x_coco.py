# Mask R-CNN, SOFT-Large, COCO 1x (paper recipe). Paper: 47.0 box / 42.2 mask AP, 84M.
_base_ = './mask-rcnn_soft-t_fpn_1x_coco.py'

# Official ImageNet SOFT-Large-Norm weights (timm format, loaded as they are): download
# them from the links in https://github.com/fudan-zvg/SOFT (README, ImageNet table;
# Google Drive) to checkpoints/soft_large_norm.pth, or point this at your copy.
pretrained = 'checkpoints/soft_large_norm.pth'

model = dict(
    backbone=dict(arch='large', drop_path_rate=0.3, init_cfg=dict(checkpoint=pretrained)))
