"""Helpers for checking mmsoft: hard kernels and float references for the numerics
(``numerics``), and an operator counter for host work per step (``profiling``)."""
from .numerics import (HARD_KERNELS, float64_iterate, hard_landmarks, hard_problem,
                       official_float32_iterate, pinv_accuracy, relative_deviation)
from .profiling import NO_KERNEL_OPS, LaunchCounter

__all__ = [
    'HARD_KERNELS', 'LaunchCounter', 'NO_KERNEL_OPS', 'float64_iterate', 'hard_landmarks',
    'hard_problem', 'official_float32_iterate', 'pinv_accuracy', 'relative_deviation'
]
