# Cascade Mask R-CNN, SOFT-Small, COCO 3x multi-scale (short side 480-800). The paper does
# not state this detector's schedule; like PVTv2's table of the same four detectors
# (Cascade Mask R-CNN, ATSS, GFL, Sparse R-CNN) we use 3x multi-scale with AdamW lr 1e-4,
# weight decay 0.01, batch 16 = 8 GPUs x 2 images. Paper: 48.3 box AP, 77M params.
_base_ = [
    '../_base_/adamw_ms-3x_coco-instance.py',
    'mmdet::_base_/models/cascade-mask-rcnn_r50_fpn.py', '../_base_/models/soft-s.py'
]

model = dict(
    backbone=dict(_base_.soft_s, _delete_=True, drop_path_rate=0.2),
    neck=dict(in_channels=[64, 128, 320, 512]))
