# UperNet, XCiT-S12/16-SimA, ADE20K 512x512, 160k iterations: XCiT's ADE20K recipe
# (XCiT paper): AdamW lr 6e-5, weight decay 0.01, 1500 warm-up iterations then poly decay
# (power 1), batch 16 = 8 GPUs x 2 images, auxiliary FCN head on level 2 (weight 0.4).
# XCiT-S12/16 (with XCA) reaches 45.9 mIoU with this recipe.
_base_ = '../_base_/upernet_adamw_8xb2-160k_ade20k-512x512.py'

# Official XCiT ImageNet weights (no SimA weights were released; XCiT's initialize
# XCiT-SimA): wget -P checkpoints https://dl.fbaipublicfiles.com/xcit/xcit_small_12_p16_224.pth
pretrained = 'checkpoints/xcit_small_12_p16_224.pth'

model = dict(
    backbone=dict(
        _delete_=True,
        type='XCiTSimA',
        arch='s12',
        patch_size=16,
        out_indices=(3, 5, 7, 11),
        drop_path_rate=0.1,
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[384, 384, 384, 384]),
    auxiliary_head=dict(in_channels=384))  # mmseg's auxiliary loss weight is 0.4 already
