# Mask R-CNN, XCiT-T12/16-SimA, COCO 3x (recipe as XCiT-S12/16-SimA).
_base_ = './mask-rcnn_xcit-sima-s12-p16_fpn_ms-crop-3x_coco.py'

# Official XCiT ImageNet weights (no SimA weights were released; XCiT's initialize
# XCiT-SimA): wget -P checkpoints https://dl.fbaipublicfiles.com/xcit/xcit_tiny_12_p16_224.pth
pretrained = 'checkpoints/xcit_tiny_12_p16_224.pth'

model = dict(
    backbone=dict(arch='t12', init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[192, 192, 192, 192]))
