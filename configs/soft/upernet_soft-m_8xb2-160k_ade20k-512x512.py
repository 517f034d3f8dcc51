# UperNet, SOFT-Medium, ADE20K 512x512, 160k iterations (recipe as SOFT-Small).
# Paper: 48.0 mIoU, 76M params.
_base_ = './upernet_soft-s_8xb2-160k_ade20k-512x512.py'

pretrained = 'checkpoints/soft_medium_norm.pth'  # SOFT-Medium-Norm: see ../_base_/models/soft-s.py

model = dict(
    backbone=dict(arch='medium', drop_path_rate=0.2, init_cfg=dict(checkpoint=pretrained)),
    decode_head=dict(in_channels=[64, 128, 288, 512]),
    auxiliary_head=dict(in_channels=288))
