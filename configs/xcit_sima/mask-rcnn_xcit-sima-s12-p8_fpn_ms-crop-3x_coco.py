# Mask R-CNN, XCiT-S12/8-SimA, COCO 3x (recipe as XCiT-S12/16-SimA; patch 8: strides
# 4/8/16/32 come from one transposed conv, identity and two max-pools).
_base_ = './mask-rcnn_xcit-sima-s12-p16_fpn_ms-crop-3x_coco.py'

# Official XCiT ImageNet weights (no SimA weights were released; XCiT's initialize
# XCiT-SimA): wget -P checkpoints https://dl.fbaipublicfiles.com/xcit/xcit_small_12_p8_224.pth
pretrained = 'checkpoints/xcit_small_12_p8_224.pth'

model = dict(backbone=dict(patch_size=8, init_cfg=dict(checkpoint=pretrained)))
