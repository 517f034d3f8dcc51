# mmdet's Mask R-CNN R-50-FPN model with a SOFT-Small backbone (./soft-s.py; all four
# stages to the FPN).
_base_ = ['mmdet::_base_/models/mask-rcnn_r50_fpn.py', './soft-s.py']

model = dict(
    backbone=dict(_base_.soft_s, _delete_=True), neck=dict(in_channels=[64, 128, 320, 512]))
