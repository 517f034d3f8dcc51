# Cascade Mask R-CNN, SOFT-Small, COCO 3x multi-scale (short side 480-800). The paper does
# not state this detector's schedule; like PVTv2's table of the same four detectors
# (Cascade Mask R-CNN, ATSS, GFL, Sparse R-CNN) we use 3x multi-scale with AdamW lr 1e-4,
# weight decay 0.01, batch 16 = 8 GPUs x 2 images. Paper: 48.3 box AP, 77M params.
_base_ = [
    '../_base_/adamw_ms-3x_coco-instance.py',
    'mmdet::_base_/models/cascade-mask-rcnn_r50_fpn.py'
]
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
        drop_path_rate=0.2,
        # statistics over the whole batch of 16 (reverted to BN in single-process runs)
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[64, 128, 320, 512]))
