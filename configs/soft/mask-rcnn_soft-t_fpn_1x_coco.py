# Mask R-CNN with a SOFT-Tiny backbone, COCO, 1x schedule (12 epochs).
# Recipe: the SOFT paper's (AdamW lr 1e-4, weight decay 0.01 in adamw_1x.py; batch 16 = 8 x 2
# images, short side 800 / long side <= 1333). Paper: 41.2 box / 38.2 mask AP, 33M params.
_base_ = [
    '../_base_/models/mask-rcnn_soft-s_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    '../_base_/schedules/adamw_1x.py', 'mmdet::_base_/default_runtime.py'
]

# Official ImageNet SOFT-Tiny-Norm weights (timm format, loaded as they are): download
# them from the links in https://github.com/fudan-zvg/SOFT (README, ImageNet table;
# Google Drive) to checkpoints/soft_tiny_norm.pth, or point this at your copy.
pretrained = 'checkpoints/soft_tiny_norm.pth'

model = dict(backbone=dict(arch='tiny', init_cfg=dict(checkpoint=pretrained)))
