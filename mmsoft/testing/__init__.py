"""Helpers for checking mmsoft: hard kernels and float references for the numerics
(``numerics``), the network-level fidelity floor (``fidelity``), and an operator counter
for host work per step (``profiling``)."""
from .fidelity import (FIDELITY_IMAGES, GRADIENT_TOL, NATURAL_IMAGES, OUTPUT_TOL,
                       fidelity_image, gradient_deviations, output_deviations,
                       reference_gradients, reference_outputs)
from .numerics import (HARD_KERNELS, KERNEL_BOUND, PINV_PATHS, PLAN_PATHS, float64_iterate,
                       hard_landmarks, hard_problem, kernel_bound, official_float32_iterate,
                       pinv_accuracy, relative_deviation)
from .profiling import NO_KERNEL_OPS, LaunchCounter

__all__ = [
    'FIDELITY_IMAGES', 'GRADIENT_TOL', 'NATURAL_IMAGES', 'OUTPUT_TOL', 'fidelity_image',
    'gradient_deviations', 'output_deviations', 'reference_gradients', 'reference_outputs',
    'HARD_KERNELS', 'KERNEL_BOUND', 'LaunchCounter', 'NO_KERNEL_OPS', 'PINV_PATHS', 'PLAN_PATHS',
    'float64_iterate', 'hard_landmarks', 'hard_problem', 'kernel_bound',
    'official_float32_iterate', 'pinv_accuracy', 'relative_deviation'
]
