# UperNet, SOFT-Small, ADE20K 512x512, 160k iterations, as
# ./upernet_soft-s_8xb2-160k_ade20k-512x512.py but with the fast mode `landmark_grid=16`
# (at most 16x16 landmarks per head, ./README.md). The paper gives no mIoU for it and it
# has not been trained.
_base_ = './upernet_soft-s_8xb2-160k_ade20k-512x512.py'

model = dict(backbone=dict(landmark_grid=16))
