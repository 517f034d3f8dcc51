# mmdet's 1x schedule (12 epochs, steps at 8 and 11) with the SOFT paper's optimizer
# (./adamw.py: AdamW lr 1e-4, weight decay 0.01, batch 16).
_base_ = ['mmdet::_base_/schedules/schedule_1x.py', './adamw.py']

optim_wrapper = dict(
    _base_.soft_optim_wrapper, optimizer=dict(_base_.soft_optim_wrapper.optimizer, _delete_=True))

# lr is for a total batch of 16 (8 GPUs x 2 images); for another number of GPUs run
# tools/train.py with --auto-scale-lr (lr scales with the total batch size).
auto_scale_lr = dict(enable=False, base_batch_size=16)
