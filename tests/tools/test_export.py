"""ONNX export keeps the model as it was and refuses what it cannot express."""
import os.path as osp

import pytest
from conftest import load_tool

pytest.importorskip('onnx')


def _tiny_soft(method):
    from mmsoft.models import SOFT
    from mmsoft.models.backbones.soft import SoftKernelAttention
    model = SOFT(arch=dict(embed_dims=[16, 32, 32, 32], num_heads=[1, 1, 1, 1],
                           depths=[1, 1, 1, 1]), pinv_method=method).eval()
    layers = [m for m in model.modules() if isinstance(m, SoftKernelAttention)]
    assert layers
    return model, layers


def test_export_restores_the_models_method(tmp_path):
    export_onnx = load_tool('tools/deployment/export_onnx.py')
    model, layers = _tiny_soft('spectral')
    export_onnx.export(model, str(tmp_path / 'soft.onnx'), sample_hw=(64, 64))
    assert osp.getsize(tmp_path / 'soft.onnx') > 0
    assert {m.pinv_method for m in layers} == {'spectral'}


def test_export_refuses_regularized(tmp_path):
    export_onnx = load_tool('tools/deployment/export_onnx.py')
    model, layers = _tiny_soft('regularized')
    with pytest.raises(ValueError, match='regularized'):
        export_onnx.export(model, str(tmp_path / 'soft.onnx'), sample_hw=(64, 64))
    assert {m.pinv_method for m in layers} == {'regularized'}
    assert not osp.exists(tmp_path / 'soft.onnx')
