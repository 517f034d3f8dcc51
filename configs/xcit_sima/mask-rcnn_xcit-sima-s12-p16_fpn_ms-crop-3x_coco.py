# Mask R-CNN, XCiT-S12/16-SimA, COCO 3x: the SimA paper's recipe: AdamW lr 1e-4,
# weight decay 0.05, 36 epochs (steps at 27 and 33), batch 16 = 8 GPUs x 2 images,
# DETR-style multi-scale augmentation (short side 480-800, random crop), FPN on blocks
# 4, 6, 8, 12. Paper: 44.8 box / 40.3 mask AP, 44.3M params.
# mmdet's Swin-T ms-crop-3x config already holds exactly this data pipeline and schedule.
_base_ = 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py'
custom_imports = dict(imports=['mmsoft'], allow_failed_imports=False)

# Official XCiT-S12/16 ImageNet weights (no SimA weights were released; XCiT's initialize
# XCiT-SimA; XCA's temperatures are dropped when loading), or an XCiT-S12/16-SimA ImageNet
# checkpoint: wget -P checkpoints https://dl.fbaipublicfiles.com/xcit/xcit_small_12_p16_224.pth
pretrained = 'checkpoints/xcit_small_12_p16_224.pth'

model = dict(
    backbone=dict(
        _delete_=True,
        type='XCiTSimA',
        arch='s12',
        patch_size=16,
        out_indices=(3, 5, 7, 11),
        drop_path_rate=0.05,
        # statistics over the whole batch of 16 (reverted to BN in single-process runs)
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[384, 384, 384, 384]))

optim_wrapper = dict(
    optimizer=dict(lr=1e-4, weight_decay=0.05),
    paramwise_cfg=dict(_delete_=True, norm_decay_mult=0.))
# for another number of GPUs run tools/train.py with --auto-scale-lr
auto_scale_lr = dict(enable=False, base_batch_size=16)
