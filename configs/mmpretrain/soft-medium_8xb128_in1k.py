# ImageNet-1k pre-training of SOFT-Medium (recipe as SOFT-Tiny). Paper: 45M params.
_base_ = './soft-tiny_8xb128_in1k.py'

model = dict(backbone=dict(arch='medium', drop_path_rate=0.2))
