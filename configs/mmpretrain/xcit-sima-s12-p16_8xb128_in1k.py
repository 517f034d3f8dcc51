# ImageNet-1k pre-training of XCiT-S12/16-SimA with MMPretrain. Recipe of XCiT/SimA
# (DeiT style): 400 epochs in XCiT, here mmpretrain's 300-epoch AdamW schedule (lr 1e-3
# for batch 1024 = 8 GPUs x 128, weight decay 0.05, cosine, 20 warm-up epochs), Mixup /
# CutMix, label smoothing. Difference from the official model: the classifier pools the
# last block's tokens (global average) instead of XCiT's two class-attention blocks,
# which dense prediction drops anyway.
_base_ = [
    'mmpretrain::_base_/datasets/imagenet_bs64_swin_224.py',
    'mmpretrain::_base_/schedules/imagenet_bs1024_adamw_swin.py',
    'mmpretrain::_base_/default_runtime.py'
]
custom_imports = dict(imports=['mmsoft'], allow_failed_imports=False)

model = dict(
    type='ImageClassifier',
    backbone=dict(type='XCiTSimA', arch='s12', patch_size=16, out_indices=(3, 5, 7, 11),
                  with_pyramid=False, drop_path_rate=0.05),
    neck=dict(type='GlobalAveragePooling'),
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        in_channels=384,
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        cal_acc=False),
    train_cfg=dict(augments=[dict(type='Mixup', alpha=0.8), dict(type='CutMix', alpha=1.0)]))

# 8 GPUs x 128 images = 1024; with other GPU counts use --auto-scale-lr.
train_dataloader = dict(batch_size=128)
optim_wrapper = dict(paramwise_cfg=dict(norm_decay_mult=0.))
