# ATSS, SOFT-Small, COCO: mmdet's standard ATSS schedule (1x, 12 epochs, single scale)
# with the SOFT paper's optimizer (AdamW lr 1e-4, weight decay 0.01, batch 16 = 8 GPUs x 2
# images). Paper: 46.7 box AP, 32M params (the paper does not state its ATSS schedule).
_base_ = [
    'mmdet::atss/atss_r50_fpn_1x_coco.py', '../_base_/models/soft-s_fpn-p3.py',
    '../_base_/schedules/adamw.py'
]

model = {{_base_.soft_s_fpn_p3}}
optim_wrapper = dict(
    _base_.soft_optim_wrapper, optimizer=dict(_base_.soft_optim_wrapper.optimizer, _delete_=True))
