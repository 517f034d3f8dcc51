# ImageNet-1k pre-training of SOFT-Tiny with MMPretrain, to make the checkpoints the
# detection and segmentation configs start from. Recipe of the SOFT paper (DeiT/PVT
# style): 300 epochs, AdamW lr 1e-3 for batch 1024 (8 GPUs x 128), weight decay 0.05,
# cosine decay after 20 warm-up epochs, RandAugment, Mixup 0.8 / CutMix 1.0, label
# smoothing 0.1, random erasing; classification from the stage-4 class token, as the
# official model does. Paper: 13M params.
_base_ = '../_base_/adamw_8xb128-300e_in1k.py'

model = dict(
    backbone=dict(type='SOFT', arch='tiny', out_indices=(3, ), out_type='cls_token',
                  drop_path_rate=0.1),
    neck=None,
    head=dict(in_channels=512))

optim_wrapper = dict(
    paramwise_cfg=dict(
        custom_keys={'pos_embed': dict(decay_mult=0.), 'cls_token': dict(decay_mult=0.)}))
