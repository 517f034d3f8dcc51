# Mask R-CNN, XCiT-S12/8-SimA, COCO 3x (recipe as XCiT-S12/16-SimA; patch 8: strides
# 4/8/16/32 come from one transposed conv, identity and two max-pools).
_base_ = './mask-rcnn_xcit-sima-s12-p16_fpn_ms-crop-3x_coco.py'

pretrained = 'checkpoints/xcit_small_12_p8_224.pth'  # official XCiT-S12/8 ImageNet

model = dict(backbone=dict(patch_size=8, init_cfg=dict(checkpoint=pretrained)))
