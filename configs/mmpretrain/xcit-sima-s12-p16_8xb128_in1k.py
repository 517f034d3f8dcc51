# ImageNet-1k pre-training of XCiT-S12/16-SimA with MMPretrain. Recipe of XCiT/SimA
# (DeiT style): 400 epochs in XCiT, here mmpretrain's 300-epoch AdamW schedule (lr 1e-3
# for batch 1024 = 8 GPUs x 128, weight decay 0.05, cosine, 20 warm-up epochs), Mixup /
# CutMix, label smoothing. Difference from the official model: the classifier pools the
# last block's tokens (global average) instead of XCiT's two class-attention blocks,
# which dense prediction drops anyway.
_base_ = '../_base_/adamw_8xb128-300e_in1k.py'

model = dict(
    # the last block's tokens (level 3 without the pyramid: block 11 at stride 16)
    backbone=dict(type='XCiTSimA', arch='s12', patch_size=16, out_indices=-1,
                  with_pyramid=False, drop_path_rate=0.05),
    neck=dict(type='GlobalAveragePooling'),
    head=dict(in_channels=384))
