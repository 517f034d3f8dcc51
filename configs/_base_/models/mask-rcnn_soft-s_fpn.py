# mmdet's Mask R-CNN R-50-FPN model with a SOFT-Small backbone (all four stages to the FPN).
_base_ = 'mmdet::_base_/models/mask-rcnn_r50_fpn.py'
custom_imports = dict(imports=['mmsoft'], allow_failed_imports=False)

# Official ImageNet SOFT-Small-Norm weights (timm format, loaded as they are): download
# them from the links in https://github.com/fudan-zvg/SOFT (README, ImageNet table;
# Google Drive) to checkpoints/soft_small_norm.pth, or point this at your copy.
pretrained = 'checkpoints/soft_small_norm.pth'

model = dict(
    backbone=dict(
        _delete_=True,
        type='SOFT',
        arch='small',
        out_indices=(0, 1, 2, 3),
        drop_path_rate=0.1,
        # statistics over the whole batch of 16 (reverted to BN in single-process runs)
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[64, 128, 320, 512]))
