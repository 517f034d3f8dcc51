# COCO instance segmentation, 3x schedule (36 epochs: 12 epochs over the dataset repeated
# 3 times, steps at 9 and 11), multi-scale training with short side 480-800 (the SOFT
# paper's 3x recipe), AdamW lr 1e-4, weight decay 0.01 (./schedules/adamw.py), batch 16 =
# 8 GPUs x 2 images.
_base_ = ['mmdet::common/ms_3x_coco-instance.py', './schedules/adamw.py']

train_pipeline = [
    dict(type='LoadImageFromFile', backend_args={{_base_.backend_args}}),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True, poly2mask=False),
    dict(type='RandomResize', scale=[(1333, 480), (1333, 800)], keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
train_dataloader = dict(dataset=dict(dataset=dict(pipeline=train_pipeline)))

optim_wrapper = dict(_base_.soft_optim_wrapper, _delete_=True)

# for another number of GPUs run tools/train.py with --auto-scale-lr
auto_scale_lr = dict(enable=False, base_batch_size=16)
