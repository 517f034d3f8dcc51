import os
import os.path as osp
import shutil
import sys

from setuptools import find_packages, setup

ROOT = osp.dirname(osp.abspath(__file__))
MIM_FILES = ['configs', 'tools', 'README.md', 'model-index.yml']


def read_version():
    ns = {}
    with open(osp.join(ROOT, 'mmsoft', 'version.py')) as f:
        exec(f.read(), ns)
    return ns['__version__']


def read_readme():
    with open(osp.join(ROOT, 'README.md'), encoding='utf-8') as f:
        return f.read()


def add_mim_extension():
    """Put configs/, tools/ and model-index.yml into mmsoft/.mim, where `mim train/test
    mmsoft` look for the configs and tools and `mim search mmsoft` for the model index
    (which imports configs/*/metafile.yml): symbolic links for an editable (develop)
    install, copies for a wheel."""
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
    long_description=read_readme(),
    long_description_content_type='text/markdown',
    keywords='computer vision, vision transformer, softmax-free attention, linear '
    'attention, SOFT, SimA, XCiT, object detection, semantic segmentation, OpenMMLab',
    # the LICENSE file is picked up by setuptools' default license_files; no 'License ::'
    # classifier, which setuptools >= 77 deprecates in favour of the license field
    license='Apache License 2.0',
    classifiers=[
        'Operating System :: OS Independent',
        'Programming Language :: Python :: 3',
        'Topic :: Scientific/Engineering :: Artificial Intelligence',
        'Topic :: Scientific/Engineering :: Image Recognition',
    ],
    project_urls={
        'SOFT paper (IJCV 2024)': 'https://arxiv.org/abs/2207.03341',
        'SOFT paper (NeurIPS 2021)': 'https://arxiv.org/abs/2110.11945',
        'SOFT official code': 'https://github.com/fudan-zvg/SOFT',
        'SimA paper (WACV 2024)': 'https://arxiv.org/abs/2206.08898',
        'SimA official code': 'https://github.com/UCDvision/sima',
    },
    packages=find_packages(include=['mmsoft', 'mmsoft.*']),
    python_requires='>=3.8',
    # mmengine and mmcv come from one of two stacks with the same import names but
    # different distribution names (mmengine / onedl-mmengine, ...): requiring one here
    # would make pip install it over the other. Pick the stack with an extra (mmcv, which
    # has no wheel for current torch, is built by scripts/setup_env.sh).
    install_requires=['torch>=2.1'],  # the oldest tested: MMSOFT_STACK=oldest
    extras_require={
        'openmmlab': ['mmengine==0.10.7', 'mmdet==3.3.0', 'mmsegmentation==1.2.2',
                      'mmpretrain==1.2.0', 'ftfy', 'regex', 'threadpoolctl>=3.5'],
        'onedl': ['onedl-mmengine==0.10.12', 'onedl-mmdetection==3.5.1',
                  'onedl-mmsegmentation==1.4.2', 'onedl-mmpretrain==1.3.6', 'ftfy',
                  'regex', 'threadpoolctl>=3.5'],
    },
    package_data={'mmsoft': ['.mim/configs/**/*.py', '.mim/configs/**/*.yml',
                             '.mim/configs/**/*.md', '.mim/tools/**/*', '.mim/README.md',
                             '.mim/model-index.yml']},
    zip_safe=False,
)
