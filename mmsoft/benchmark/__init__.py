"""The sections of tools/analysis_tools/benchmark.py (the CLI), as a library.

Each section is a function ``section_NAME(args, out)``: it measures with the options in
``args`` (the CLI's argparse namespace), stores its numbers under ``out[NAME]`` (what
``--json`` writes) and returns the lines it prints (Markdown tables and sentences).

    common    models by name (``build``, ``SOFT_MODES``), ``measure``, the measurement in
              a fresh process (``child``), formatting
    plan      pinv, matmul, dwconv, kernel: the measurements behind SOFT's per-device
              plan (``pinv`` and its options, ``local_conv_layout``, ``kernel_chunk`` /
              ``kernel_once_up_to`` of mmsoft/models/attention/plan.py)
    speed     speed, train: backbone forward and training step next to Swin-T & co.
              (``--compile``: also under torch.compile)
    modes     modes: SOFT's attention modes, time and deviation from the exact iterate
    memory    memory, scaling: peak memory per process, time and memory over sizes
    launches  launches: operators per step and their matrix products' floating-point
              operations, with CUDA's plan on the meta device
    detector  detector: RetinaNet and Mask R-CNN iterations, SOFT-S vs Swin-T
    profile   profile: SOFT-S's forward and training step by kernel, per plan

``SECTIONS`` maps each name to its function, in the order the CLI runs them by default.
"""
from .detector import section_detector
from .launches import section_launches
from .memory import section_memory, section_scaling
from .modes import section_modes
from .plan import section_dwconv, section_kernel, section_matmul, section_pinv
from .profile import section_profile
from .speed import section_speed, section_train

SECTIONS = {'pinv': section_pinv, 'matmul': section_matmul, 'dwconv': section_dwconv,
            'kernel': section_kernel, 'speed': section_speed, 'train': section_train,
            'modes': section_modes, 'memory': section_memory, 'scaling': section_scaling,
            'launches': section_launches, 'detector': section_detector,
            'profile': section_profile}

__all__ = [
    'SECTIONS', 'section_detector', 'section_dwconv', 'section_kernel', 'section_launches',
    'section_matmul', 'section_memory', 'section_modes', 'section_pinv', 'section_profile',
    'section_scaling', 'section_speed', 'section_train'
]
