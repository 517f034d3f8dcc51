# mmdet's 1x schedule (12 epochs, steps at 8 and 11) with the SOFT paper's optimizer:
# AdamW lr 1e-4, weight decay 0.01, no decay on norms, position embeddings, class token.
_base_ = 'mmdet::_base_/schedules/schedule_1x.py'

optim_wrapper = dict(
    optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, betas=(0.9, 0.999),
                   weight_decay=0.01),
    paramwise_cfg=dict(
        norm_decay_mult=0.,
        custom_keys={'pos_embed': dict(decay_mult=0.), 'cls_token': dict(decay_mult=0.)}))

# lr is for a total batch of 16 (8 GPUs x 2 images); for another number of GPUs run
# tools/train.py with --auto-scale-lr (lr scales with the total batch size).
auto_scale_lr = dict(enable=False, base_batch_size=16)
