# ImageNet-1k pre-training of SOFT-Tiny with MMPretrain, to make the checkpoints the
# detection and segmentation configs start from. Recipe of the SOFT paper (DeiT/PVT
# style): 300 epochs, AdamW lr 1e-3 for batch 1024 (8 GPUs x 128), weight decay 0.05,
# cosine decay after 20 warm-up epochs, RandAugment, Mixup 0.8 / CutMix 1.0, label
# smoothing 0.1, random erasing; classification from the stage-4 class token, as the
# official model does. Paper: 13M params.
_base_ = [
    'mmpretrain::_base_/datasets/imagenet_bs64_swin_224.py',
    'mmpretrain::_base_/schedules/imagenet_bs1024_adamw_swin.py',
    'mmpretrain::_base_/default_runtime.py'
]
custom_imports = dict(imports=['mmsoft'], allow_failed_imports=False)

model = dict(
    type='ImageClassifier',
    backbone=dict(type='SOFT', arch='tiny', out_indices=(3, ), out_type='cls_token',
                  drop_path_rate=0.1),
    neck=None,
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        in_channels=512,
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        cal_acc=False),
    train_cfg=dict(augments=[dict(type='Mixup', alpha=0.8), dict(type='CutMix', alpha=1.0)]))

# 8 GPUs x 128 images = 1024; with other GPU counts use --auto-scale-lr.
train_dataloader = dict(batch_size=128)
optim_wrapper = dict(
    paramwise_cfg=dict(
        norm_decay_mult=0.,
        custom_keys={'pos_embed': dict(decay_mult=0.), 'cls_token': dict(decay_mult=0.)}))
