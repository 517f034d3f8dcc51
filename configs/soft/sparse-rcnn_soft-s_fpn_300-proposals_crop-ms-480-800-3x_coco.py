# Sparse R-CNN (300 proposals), SOFT-Small, COCO: mmdet's standard Sparse R-CNN recipe
# (3x, 36 epochs, DETR-style multi-scale + crop augmentation, short side 480-800) with the
# SOFT paper's optimizer (AdamW lr 1e-4, weight decay 0.01, batch 16 = 8 GPUs x 2 images;
# mmdet's ResNet recipe uses lr 2.5e-5, wd 1e-4). Paper: 47.1 box AP, 106M params.
_base_ = 'mmdet::sparse_rcnn/sparse-rcnn_r50_fpn_300-proposals_crop-ms-480-800-3x_coco.py'
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

optim_wrapper = dict(
    optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, betas=(0.9, 0.999),
                   weight_decay=0.01),
    paramwise_cfg=dict(
        norm_decay_mult=0.,
        custom_keys={'pos_embed': dict(decay_mult=0.), 'cls_token': dict(decay_mult=0.)}))
# for another number of GPUs run tools/train.py with --auto-scale-lr
auto_scale_lr = dict(enable=False, base_batch_size=16)
