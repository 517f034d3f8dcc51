from .soft import SOFT
from .xcit_sima import XCiTSimA

__all__ = ['SOFT', 'XCiTSimA']
