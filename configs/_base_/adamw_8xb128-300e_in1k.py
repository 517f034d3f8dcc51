# ImageNet-1k classifier pre-training, DeiT style (AdamW, 300 epochs), without the backbone.
_base_ = [
    'mmpretrain::_base_/datasets/imagenet_bs64_swin_224.py',
    'mmpretrain::_base_/schedules/imagenet_bs1024_adamw_swin.py',
    'mmpretrain::_base_/default_runtime.py'
]
custom_imports = dict(imports=['mmsoft'], allow_failed_imports=False)

model = dict(
    type='ImageClassifier',
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        cal_acc=False),
    train_cfg=dict(augments=[dict(type='Mixup', alpha=0.8), dict(type='CutMix', alpha=1.0)]))

# 8 GPUs x 128 images = 1024; with other GPU counts use --auto-scale-lr.
train_dataloader = dict(batch_size=128)
optim_wrapper = dict(paramwise_cfg=dict(norm_decay_mult=0.))
