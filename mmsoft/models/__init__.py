from . import attention
from .backbones import SOFT, XCiTSimA

__all__ = ['attention', 'SOFT', 'XCiTSimA']
