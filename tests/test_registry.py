"""mmsoft's backbones build by type name from mmdet, mmseg and mmpretrain scopes."""
import importlib

import pytest
import torch
from mmengine.registry import init_default_scope


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg', 'mmpretrain'])
@pytest.mark.parametrize('type_name', ['SOFT', 'mmsoft.SOFT', 'XCiTSimA', 'mmsoft.XCiTSimA'])
def test_build_from_codebase_scope(scope, type_name):
    import mmsoft  # noqa: F401
    registry = importlib.import_module(f'{scope}.registry').MODELS
    init_default_scope(scope)
    arch = 'tiny' if 'SOFT' in type_name else 't12'
    model = registry.build(dict(type=type_name, arch=arch))
    from mmsoft.models import SOFT, XCiTSimA
    assert isinstance(model, SOFT if 'SOFT' in type_name else XCiTSimA)


def test_xcit_name_does_not_collide_with_mmpretrain():
    import mmsoft  # noqa: F401
    from mmpretrain.registry import MODELS
    init_default_scope('mmpretrain')
    xcit = MODELS.get('XCiT')
    assert xcit.__module__.startswith('mmpretrain')


def test_import_twice_through_custom_imports():
    """A config's ``custom_imports`` after a plain ``import mmsoft`` registers nothing twice
    and builds the package's own class, which runs and returns the four pyramid levels."""
    import mmsoft
    from mmengine.config import Config
    from mmengine.utils import import_modules_from_strings
    cfg = Config(dict(custom_imports=dict(imports=['mmsoft'], allow_failed_imports=False)))
    import_modules_from_strings(**cfg.custom_imports)
    import_modules_from_strings(**cfg.custom_imports)
    from mmdet.registry import MODELS
    init_default_scope('mmdet')
    model = MODELS.build(dict(type='SOFT', arch='tiny'))
    assert type(model) is mmsoft.SOFT
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 64, 64))
    assert [tuple(o.shape) for o in outs] == [
        (1, c, 64 // s, 64 // s) for c, s in zip(model.embed_dims, (4, 8, 16, 32))]


def test_foreign_class_with_same_name_is_refused():
    from mmsoft.registry import MODELS, register_in

    class SOFT(torch.nn.Module):  # noqa: N801 - a different project's class
        pass

    with pytest.raises(KeyError, match='already registered'):
        register_in(MODELS, SOFT)


def test_cpu_ddp_wrapper_resolves_from_codebases_and_checks_launcher():
    import mmsoft  # noqa: F401
    from mmengine.config import Config
    from mmsoft.engine import CPUDistributedDataParallel, setup_cpu_distributed
    from mmdet.registry import MODEL_WRAPPERS
    init_default_scope('mmdet')
    assert MODEL_WRAPPERS.get('CPUDistributedDataParallel') is CPUDistributedDataParallel
    assert setup_cpu_distributed(Config(dict(launcher='none'))) is False
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match='launcher pytorch'):
            setup_cpu_distributed(Config(dict(launcher='slurm')))


@pytest.mark.parametrize('doc', ['README.md', 'docs/en/user_guides/backbones.md'])
def test_the_docs_config_snippet_builds_both_full_backbones(doc):
    """The backbone dict users copy (its first python block), as written and as its
    comment says to write it for XCiT-SimA, builds through mmdet's registry the
    backbones the arch names: every stage, every block and the four levels."""
    import re

    import mmsoft  # noqa: F401
    from mmdet.registry import MODELS
    from mmengine.config import Config
    from conftest import ROOT
    from mmsoft.models import SOFT, XCiTSimA
    text = open(f'{ROOT}/{doc}', encoding='utf-8').read()
    snippet = re.search(r'```python\n(custom_imports.*?)```', text, re.S).group(1)
    xcit = re.search(r"type='SOFT',\s+# XCiT-SimA: type='XCiTSimA', arch='(\w+)'", snippet)
    assert xcit, f'{doc}: the snippet no longer says how to write XCiT-SimA'
    init_default_scope('mmdet')
    for type_name, arch, cls in (('SOFT', None, SOFT), ('XCiTSimA', xcit.group(1), XCiTSimA)):
        backbone = Config.fromstring(snippet, '.py').model.backbone.to_dict()
        for key in ('_delete_', 'init_cfg'):  # the checkpoint file is the user's
            backbone.pop(key)
        backbone['type'] = type_name
        if arch is not None:
            backbone['arch'] = arch
        model = MODELS.build(backbone)
        assert isinstance(model, cls)
        reference = cls(arch=backbone['arch'])
        assert model.out_indices == (0, 1, 2, 3)
        assert (sum(p.numel() for p in model.parameters())
                == sum(p.numel() for p in reference.parameters())), type_name
        if cls is XCiTSimA:
            assert len(model.blocks) == model.depth == 12
