# UperNet, SOFT-Small, ADE20K 512x512, 160k iterations, batch 16 = 8 GPUs x 2 images,
# no multi-scale training or testing (the paper's recipe). Optimizer: AdamW with mmseg's
# transformer-UperNet settings (lr 6e-5, weight decay 0.01, 1500 linear warm-up iterations
# then poly decay); the paper's text says lr 6e-4, which we consider a typo for 6e-5.
# Paper: 46.2 mIoU, 54M params.
_base_ = [
    '../_base_/upernet_adamw_8xb2-160k_ade20k-512x512.py', '../_base_/models/soft-s.py'
]

model = dict(
    backbone=dict(_base_.soft_s, _delete_=True),
    decode_head=dict(in_channels=[64, 128, 320, 512]),
    auxiliary_head=dict(in_channels=320))

optim_wrapper = dict(
    paramwise_cfg=dict(
        custom_keys={'pos_embed': dict(decay_mult=0.), 'cls_token': dict(decay_mult=0.)}))
