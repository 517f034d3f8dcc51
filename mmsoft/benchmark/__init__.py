"""The sections of tools/analysis_tools/benchmark.py (the CLI), as a library.

Each section is a function ``section_NAME(args, out)``: it measures with the options in
``args`` (the CLI's argparse namespace), stores its numbers under ``out[NAME]`` (what
``--json`` writes) and returns the lines it prints (Markdown tables and sentences).

    common    models by name (``build``, ``SOFT_MODES``), the plans by path name
              (``path_plan``), ``measure``, the measurement in a fresh process
              (``child``), the tools' ``--import`` (``import_modules``), formatting
    speed     speed, train: backbone forward and training step next to Swin-T & co.
              (``--compile``: also under torch.compile)
    modes     modes: SOFT's attention modes, time and deviation from the exact iterate
    memory    memory, scaling: peak memory per process, time and memory over sizes
    launches  launches: operators per step and their matrix products' floating-point
              operations, with CUDA's plan on the meta device
    detector  detector: RetinaNet and Mask R-CNN iterations, SOFT-S vs Swin-T
    profile   profile: SOFT-S's forward and training step by kernel, per plan

``SECTIONS`` maps each name to its function, in the order the CLI runs them by default.
A package outside mmsoft adds its own when its ``benchmark`` module is imported (the
CLI's ``--import PACKAGE`` imports it): ``projects.soft_lab.benchmark`` adds the lab's
pinv, matmul, dwconv and kernel sections, the measurements behind SOFT's per-device plan,
ahead of these.
"""
from .detector import section_detector
from .launches import section_launches
from .memory import section_memory, section_scaling
from .modes import section_modes
from .profile import section_profile
from .speed import section_speed, section_train

SECTIONS = {'speed': section_speed, 'train': section_train, 'modes': section_modes,
            'memory': section_memory, 'scaling': section_scaling,
            'launches': section_launches, 'detector': section_detector,
            'profile': section_profile}

__all__ = [
    'SECTIONS', 'section_detector', 'section_launches', 'section_memory', 'section_modes',
    'section_profile', 'section_scaling', 'section_speed', 'section_train'
]
