# RetinaNet with a SOFT-Tiny backbone, COCO, 1x schedule (12 epochs).
# Recipe: the SOFT paper's (AdamW lr 1e-4, weight decay 0.01 in adamw_1x.py; batch 16 = 8 x 2
# images, short side 800 / long side <= 1333). Paper: 40.0 box AP, 23M params.
_base_ = [
    'mmdet::_base_/models/retinanet_r50_fpn.py',
    'mmdet::_base_/datasets/coco_detection.py',
    '../_base_/schedules/adamw_1x.py', 'mmdet::_base_/default_runtime.py'
]
custom_imports = dict(imports=['mmsoft'], allow_failed_imports=False)

# Official ImageNet SOFT-Tiny-Norm weights (timm format, loaded as they are): download
# them from the links in https://github.com/fudan-zvg/SOFT (README, ImageNet table;
# Google Drive) to checkpoints/soft_tiny_norm.pth, or point this at your copy.
pretrained = 'checkpoints/soft_tiny_norm.pth'

model = dict(
    backbone=dict(
        _delete_=True,
        type='SOFT',
        arch='tiny',
        out_indices=(1, 2, 3),  # only the stages the FPN uses (start_level=1)
        drop_path_rate=0.1,
        # statistics over the whole batch of 16 (reverted to BN in single-process runs)
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[128, 320, 512], start_level=0, num_outs=5))

