# GFL, SOFT-Small, COCO: mmdet's standard GFL schedule (2x, 24 epochs, multi-scale short
# side 480-800) with the SOFT paper's optimizer (AdamW lr 1e-4, weight decay 0.01, batch
# 16 = 8 GPUs x 2 images). Paper: 46.7 box AP, 32M params (schedule not stated there).
_base_ = [
    'mmdet::gfl/gfl_r50_fpn_ms-2x_coco.py', '../_base_/models/soft-s_fpn-p3.py',
    '../_base_/schedules/adamw.py'
]

model = {{_base_.soft_s_fpn_p3}}
optim_wrapper = dict(
    _base_.soft_optim_wrapper, optimizer=dict(_base_.soft_optim_wrapper.optimizer, _delete_=True))
