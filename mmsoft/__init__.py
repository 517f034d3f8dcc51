"""mmsoft: SOFT and XCiT-SimA softmax-free backbones for OpenMMLab 2.x codebases.

Importing the package (directly or through a config's ``custom_imports``) registers the
backbones and lets torch load mmengine's own checkpoints with ``weights_only`` kept on.
"""
from .checkpoint import allow_mmengine_checkpoints
from .version import __version__

allow_mmengine_checkpoints()

from .models import SOFT, XCiTSimA  # noqa: E402
from . import engine  # noqa: E402,F401  (registers CPUDistributedDataParallel)

__all__ = ['__version__', 'SOFT', 'XCiTSimA']
