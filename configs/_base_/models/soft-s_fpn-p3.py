# SOFT-Small (./soft-s.py) for mmdet's one-stage detectors whose FPN starts at P3
# (start_level=1 over ResNet's four stages; ATSS, GFL): the backbone computes only the three
# stages the FPN uses. `soft_s_fpn_p3` holds the `model` fields to set over such a whole
# mmdet config, a variable of its own as `soft_s` is; the ATSS and GFL configs set their
# `model` to it.
_base_ = './soft-s.py'

soft_s_fpn_p3 = dict(
    backbone=dict(_base_.soft_s, _delete_=True, out_indices=(1, 2, 3)),
    neck=dict(in_channels=[128, 320, 512], start_level=0))
