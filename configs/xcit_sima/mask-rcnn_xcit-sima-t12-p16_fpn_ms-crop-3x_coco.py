# Mask R-CNN, XCiT-T12/16-SimA, COCO 3x (recipe as XCiT-S12/16-SimA).
_base_ = './mask-rcnn_xcit-sima-s12-p16_fpn_ms-crop-3x_coco.py'

pretrained = 'checkpoints/xcit_tiny_12_p16_224.pth'  # official XCiT-T12/16 ImageNet

model = dict(
    backbone=dict(arch='t12', init_cfg=dict(checkpoint=pretrained)),
    neck=dict(in_channels=[192, 192, 192, 192]))
