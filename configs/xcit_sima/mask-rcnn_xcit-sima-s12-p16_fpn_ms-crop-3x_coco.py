# Mask R-CNN, XCiT-S12/16-SimA, COCO 3x: the SimA paper's recipe: AdamW lr 1e-4,
# weight decay 0.05, 36 epochs (steps at 27 and 33), batch 16 = 8 GPUs x 2 images,
# DETR-style multi-scale augmentation (short side 480-800, random crop), FPN on blocks
# 4, 6, 8, 12. Paper: 44.8 box / 40.3 mask AP, 44.3M params.
# mmdet's Swin-T ms-crop-3x config already holds exactly this data pipeline and schedule.
_base_ = [
    'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py',
    '../_base_/models/xcit-sima-s12-p16.py'
]

pretrained = _base_.xcit_sima_s12_p16.init_cfg.checkpoint  # in place of the Swin config's

model = dict(
    backbone=dict(_base_.xcit_sima_s12_p16, _delete_=True),
    neck=dict(in_channels=[384, 384, 384, 384]))

optim_wrapper = dict(
    optimizer=dict(lr=1e-4, weight_decay=0.05),
    paramwise_cfg=dict(_delete_=True, norm_decay_mult=0.))
# for another number of GPUs run tools/train.py with --auto-scale-lr
auto_scale_lr = dict(enable=False, base_batch_size=16)
