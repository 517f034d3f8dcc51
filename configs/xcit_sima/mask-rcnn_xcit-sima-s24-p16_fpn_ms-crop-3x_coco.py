# Mask R-CNN, XCiT-S24/16-SimA, COCO 3x (recipe as XCiT-S12/16-SimA; taps at blocks
# 8, 12, 16, 24).
_base_ = './mask-rcnn_xcit-sima-s12-p16_fpn_ms-crop-3x_coco.py'

# Official XCiT ImageNet weights (no SimA weights were released; XCiT's initialize
# XCiT-SimA): wget -P checkpoints https://dl.fbaipublicfiles.com/xcit/xcit_small_24_p16_224.pth
pretrained = 'checkpoints/xcit_small_24_p16_224.pth'

model = dict(
    backbone=dict(arch='s24', tap_blocks=(7, 11, 15, 23), drop_path_rate=0.1,
                  init_cfg=dict(checkpoint=pretrained)))
