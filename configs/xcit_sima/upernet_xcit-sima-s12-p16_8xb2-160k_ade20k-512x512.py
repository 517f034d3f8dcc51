# UperNet, XCiT-S12/16-SimA, ADE20K 512x512, 160k iterations: XCiT's ADE20K recipe
# (XCiT paper): AdamW lr 6e-5, weight decay 0.01, 1500 warm-up iterations then poly decay
# (power 1), batch 16 = 8 GPUs x 2 images, auxiliary FCN head on level 2 (weight 0.4).
# XCiT-S12/16 (with XCA) reaches 45.9 mIoU with this recipe.
_base_ = [
    '../_base_/upernet_adamw_8xb2-160k_ade20k-512x512.py',
    '../_base_/models/xcit-sima-s12-p16.py'
]

pretrained = _base_.xcit_sima_s12_p16.init_cfg.checkpoint

model = dict(
    # drop path 0.1: XCiT's ADE20K setting
    backbone=dict(_base_.xcit_sima_s12_p16, _delete_=True, drop_path_rate=0.1),
    decode_head=dict(in_channels=[384, 384, 384, 384]),
    auxiliary_head=dict(in_channels=384))  # mmseg's auxiliary loss weight is 0.4 already
