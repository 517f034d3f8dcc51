# Sparse R-CNN (300 proposals), SOFT-Small, COCO: mmdet's standard Sparse R-CNN recipe
# (3x, 36 epochs, DETR-style multi-scale + crop augmentation, short side 480-800) with the
# SOFT paper's optimizer (AdamW lr 1e-4, weight decay 0.01, batch 16 = 8 GPUs x 2 images;
# mmdet's ResNet recipe uses lr 2.5e-5, wd 1e-4). Paper: 47.1 box AP, 106M params.
_base_ = [
    'mmdet::sparse_rcnn/sparse-rcnn_r50_fpn_300-proposals_crop-ms-480-800-3x_coco.py',
    '../_base_/models/soft-s.py', '../_base_/schedules/adamw.py'
]

model = dict(
    backbone=dict(_base_.soft_s, _delete_=True), neck=dict(in_channels=[64, 128, 320, 512]))
# mmdet's gradient clipping stays
optim_wrapper = dict(
    _base_.soft_optim_wrapper, optimizer=dict(_base_.soft_optim_wrapper.optimizer, _delete_=True))
