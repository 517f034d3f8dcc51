"""Helpers for checking mmsoft: hard kernels and float references for the numerics
(``numerics``), the network-level fidelity floor (``fidelity``), and an operator counter
for host work per step (``profiling``)."""
from .fidelity import (FIDELITY_IMAGES, FLIP_TOL, GRADIENT_TOL, NATURAL_IMAGES,
                       OUTPUT_TOL, GradientDeviations, GradientReference, check_crop,
                       fidelity_image, gradient_deviations, official_order, output_bounds,
                       output_deviations, reference_gradients, reference_outputs)
from .numerics import (HARD_KERNELS, KERNEL_BOUND, PINV_PATHS, PLAN_PATHS, hard_landmarks,
                       hard_problem, kernel_bound, pinv_accuracy, relative_deviation)
from .profiling import NO_KERNEL_OPS, LaunchCounter, forbid_host_sync

__all__ = [
    'FIDELITY_IMAGES', 'FLIP_TOL', 'GRADIENT_TOL', 'GradientDeviations', 'GradientReference',
    'HARD_KERNELS', 'KERNEL_BOUND', 'NATURAL_IMAGES', 'check_crop',
    'NO_KERNEL_OPS', 'OUTPUT_TOL', 'PINV_PATHS', 'PLAN_PATHS', 'fidelity_image',
    'gradient_deviations', 'hard_landmarks', 'hard_problem', 'kernel_bound', 'LaunchCounter',
    'official_order', 'output_bounds',
    'output_deviations', 'forbid_host_sync',
    'pinv_accuracy', 'reference_gradients', 'reference_outputs', 'relative_deviation'
]
