# Mask R-CNN, SOFT-Small, COCO 3x with multi-scale training (short side 480-800), the
# SOFT paper's 3x recipe (AdamW lr 1e-4, weight decay 0.01, batch 16 = 8 GPUs x 2 images).
_base_ = [
    '../_base_/adamw_ms-3x_coco-instance.py', '../_base_/models/mask-rcnn_soft-s_fpn.py'
]
