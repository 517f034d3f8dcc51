# Mask R-CNN, SOFT-Small with bounded landmarks (`landmark_grid=16`, at most 16x16
# landmarks per head: ./README.md), COCO 1x; otherwise ./mask-rcnn_soft-s_fpn_1x_coco.py,
# the paper's model and recipe. No paper result: nobody has trained this fast mode.
_base_ = './mask-rcnn_soft-s_fpn_1x_coco.py'

model = dict(backbone=dict(landmark_grid=16))
