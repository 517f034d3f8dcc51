"""SOFT's lab: candidates for the per-device plans, kept outside the mmsoft package until
a measurement on their hardware decides them (README.md). Importing this package
registers them with mmsoft's dispatch (``variants.register``); mmsoft never imports it.

    custom_imports = dict(imports=['mmsoft', 'projects.soft_lab'], allow_failed_imports=False)

The measurements that decide them are the lab's too, not imported here:
``benchmark.py`` (the benchmark's plan sections, which
``tools/analysis_tools/benchmark.py --import projects.soft_lab`` imports) and
``device_report.py`` (the GPU machine's one command).
"""
from .variants import (FIRST_STEP_BOUND, GuardedTF32, HornerTF32, first_steps_needed,
                       register)

register()

__all__ = ['FIRST_STEP_BOUND', 'GuardedTF32', 'HornerTF32', 'first_steps_needed', 'register']
