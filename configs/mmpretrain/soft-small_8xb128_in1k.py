# ImageNet-1k pre-training of SOFT-Small (recipe as SOFT-Tiny). Paper: 24M params.
_base_ = './soft-tiny_8xb128_in1k.py'

model = dict(backbone=dict(arch='small', drop_path_rate=0.1))
