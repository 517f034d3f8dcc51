# The SOFT paper's detection optimizer: AdamW lr 1e-4, weight decay 0.01, no weight decay on
# norms, position embeddings and the class token; the lr is for a total batch of 16 (8 GPUs
# x 2 images). A variable of its own, `soft_optim_wrapper`, because mmengine refuses two
# bases that both define `optim_wrapper`: a config sets it over its base's SGD wrapper, whose
# other fields (e.g. gradient clipping) it keeps, as ./adamw_1x.py does, or in place of that
# wrapper, as ../adamw_ms-3x_coco-instance.py does.
soft_optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(
        norm_decay_mult=0.,
        custom_keys={'pos_embed': dict(decay_mult=0.), 'cls_token': dict(decay_mult=0.)}))
