"""mmsoft: SOFT and XCiT-SimA softmax-free backbones for OpenMMLab 2.x codebases.

Importing the package (directly or through a config's ``custom_imports``) registers the
backbones and routes mmengine's checkpoint loading through ``mmsoft.checkpoint``: torch's
``weights_only`` protection stays on, mmengine's and timm's checkpoints load, crafted ones are
refused (also where onedl-mmengine would retry them with ``weights_only=False``).
"""
from .checkpoint import guard_mmengine
from .compat import onedl_config_scopes, warn_known_conflicts
from .version import __version__

guard_mmengine()
warn_known_conflicts()  # e.g. transformers >= 5 beside mmpretrain 1.2, which breaks mmdet
onedl_config_scopes()  # mmseg:: base configs on the OneDL stack

from .models import SOFT, XCiTSimA  # noqa: E402
from . import engine  # noqa: E402,F401  (registers CPUDistributedDataParallel)

__all__ = ['__version__', 'SOFT', 'XCiTSimA']
