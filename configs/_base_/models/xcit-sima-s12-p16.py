# The XCiT-S12/16-SimA backbone of the XCiT-SimA detection and segmentation configs: blocks
# 4, 6, 8 and 12 (0-based 3, 5, 7, 11) make the stride 4/8/16/32 pyramid, levels 0-3, as
# XCiT's dense-prediction code does. It
# is a variable of its own, `xcit_sima_s12_p16`, because mmengine refuses two bases that
# both define `model`: a config takes it as `backbone=dict(_base_.xcit_sima_s12_p16,
# _delete_=True, ...)`. The configs name its checkpoint `pretrained` themselves (mmdet's
# Swin config, the detection configs' base, defines a `pretrained` of its own).
custom_imports = dict(imports=['mmsoft'], allow_failed_imports=False)

xcit_sima_s12_p16 = dict(
    type='XCiTSimA',
    arch='s12',
    patch_size=16,
    out_indices=(0, 1, 2, 3),  # pyramid levels, strides 4, 8, 16, 32
    tap_blocks=(3, 5, 7, 11),  # the blocks that feed them
    drop_path_rate=0.05,
    # statistics over the whole batch of 16 (reverted to BN in single-process runs)
    norm_cfg=dict(type='SyncBN', requires_grad=True),
    # Official XCiT ImageNet weights: they initialize XCiT-SimA (no SimA weights were
    # released; XCA's temperatures are dropped when loading), or an XCiT-SimA ImageNet
    # checkpoint of yours.
    # wget -P checkpoints https://dl.fbaipublicfiles.com/xcit/xcit_small_12_p16_224.pth
    init_cfg=dict(type='Pretrained', checkpoint='checkpoints/xcit_small_12_p16_224.pth'))
