# The SOFT-Small backbone every SOFT detection and segmentation config starts from (the
# SOFT-T/M/L configs change `arch`, `drop_path_rate` and the checkpoint): all four stages,
# strides 4 to 32, 64/128/320/512 channels (paper Table 2). It is a variable of its own,
# `soft_s`, because mmengine refuses two bases that both define `model`: a config takes it
# as `backbone=dict(_base_.soft_s, _delete_=True, ...)` (`_delete_` drops the base model's
# ResNet keys).
custom_imports = dict(imports=['mmsoft'], allow_failed_imports=False)

# Official ImageNet SOFT-Small-Norm weights (timm format, loaded as they are): download
# them from the links in https://github.com/fudan-zvg/SOFT (README, ImageNet table;
# Google Drive) to checkpoints/soft_small_norm.pth, or point this at your copy. The other
# sizes' configs expect checkpoints/soft_{tiny,medium,large}_norm.pth.
pretrained = 'checkpoints/soft_small_norm.pth'

soft_s = dict(
    type='SOFT',
    arch='small',
    out_indices=(0, 1, 2, 3),
    drop_path_rate=0.1,
    # statistics over the whole batch of 16 (reverted to BN in single-process runs)
    norm_cfg=dict(type='SyncBN', requires_grad=True),
    init_cfg=dict(type='Pretrained', checkpoint=pretrained))
