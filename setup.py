import os
import os.path as osp
import shutil
import sys

from setuptools import find_packages, setup

ROOT = osp.dirname(osp.abspath(__file__))
MIM_FILES = ['configs', 'tools', 'README.md']


def read_version():
    ns = {}
    with open(osp.join(ROOT, 'mmsoft', 'version.py')) as f:
        exec(f.read(), ns)
    return ns['__version__']


def add_mim_extension():
    """Put configs/ and tools/ into mmsoft/.mim, where `mim train/test mmsoft` look for
    them: symbolic links for an editable (develop) install, copies for a wheel."""
    editable = any(cmd in sys.argv for cmd in ('develop', 'editable_wheel'))
    mim_dir = osp.join(ROOT, 'mmsoft', '.mim')
    os.makedirs(mim_dir, exist_ok=True)
    for name in MIM_FILES:
        src = osp.join(ROOT, name)
        dst = osp.join(mim_dir, name)
        if osp.islink(dst) or osp.isfile(dst):
            os.remove(dst)
        elif osp.isdir(dst):
            shutil.rmtree(dst)
        if editable:
            os.symlink(osp.relpath(src, mim_dir), dst)
        elif osp.isdir(src):
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns('__pycache__'))
        else:
            shutil.copyfile(src, dst)


if any(cmd in sys.argv for cmd in ('develop', 'editable_wheel', 'bdist_wheel', 'build',
                                   'sdist', 'install')):
    add_mim_extension()

setup(
    name='mmsoft',
    version=read_version(),
    description='SOFT and XCiT-SimA softmax-free backbones for MMDetection, '
    'MMSegmentation and MMPretrain',
    packages=find_packages(include=['mmsoft', 'mmsoft.*']),
    python_requires='>=3.8',
    # mmengine and mmcv come from one of two stacks with the same import names but
    # different distribution names (mmengine / onedl-mmengine, ...): requiring one here
    # would make pip install it over the other. Pick the stack with an extra (mmcv, which
    # has no wheel for current torch, is built by scripts/setup_env.sh).
    install_requires=['torch>=2.0'],
    extras_require={
        'openmmlab': ['mmengine==0.10.7', 'mmdet==3.3.0', 'mmsegmentation==1.2.2',
                      'mmpretrain==1.2.0', 'ftfy', 'regex'],
        'onedl': ['onedl-mmengine==0.10.12', 'onedl-mmdetection==3.5.1',
                  'onedl-mmsegmentation==1.4.2', 'onedl-mmpretrain==1.3.6', 'ftfy',
                  'regex'],
    },
    package_data={'mmsoft': ['.mim/configs/**/*.py', '.mim/tools/**/*', '.mim/README.md']},
    zip_safe=False,
)
