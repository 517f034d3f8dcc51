# RetinaNet, SOFT-Small with bounded landmarks, COCO 1x: ./retinanet_soft-s_fpn_1x_coco.py
# (the paper's architecture, recipe and ImageNet weights) with `landmark_grid=16`, the
# fast mode: at most 16x16 landmarks per head (see ./README.md). Trained by nobody; the
# paper reports no AP for it.
_base_ = './retinanet_soft-s_fpn_1x_coco.py'

model = dict(backbone=dict(landmark_grid=16))
