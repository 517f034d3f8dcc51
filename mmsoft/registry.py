"""mmsoft's model registry.

``MODELS`` is a child of mmengine's root registry with scope ``mmsoft`` (so ``mmsoft.SOFT``
resolves from any codebase). Every mmsoft model is also registered in the root registry
itself, so an unscoped ``type='SOFT'`` resolves from mmdet, mmseg and mmpretrain configs:
each of their registries searches itself, then its parent, the root.
"""
from mmengine.registry import MODELS as ROOT_MODELS
from mmengine.registry import Registry

MODELS = Registry('model', parent=ROOT_MODELS, scope='mmsoft', locations=['mmsoft.models'])


def register_in(registry, cls):
    existing = registry.module_dict.get(cls.__name__)
    # Re-importing mmsoft (importlib.reload, a second custom_imports) re-creates the class:
    # replace our own entry, but never a different project's class of the same name.
    same = existing is not None and (existing.__module__, existing.__qualname__) == (
        cls.__module__, cls.__qualname__)
    if existing is not None and not same:
        raise KeyError(f'{cls.__name__} is already registered in the {registry.scope} '
                       f'{registry.name} registry by {existing.__module__}')
    registry.register_module(module=cls, force=same)


def register_model():
    """Class decorator: register in mmsoft's MODELS and in mmengine's root MODELS."""

    def wrap(cls):
        register_in(MODELS, cls)
        register_in(ROOT_MODELS, cls)
        return cls

    return wrap
