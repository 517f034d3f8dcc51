"""The model zoo `mim search mmsoft` lists: model-index.yml imports configs/*/metafile.yml,
every SOFT and XCiT-SimA config is in it once, with the parameter count of the model it
builds and the schedule it trains, and this venv's mim lists every model with its metrics."""
import ast
import glob
import importlib
import os.path as osp
import re
import subprocess
import sys
from collections import Counter

import pytest
import yaml
from conftest import ROOT

FAMILIES = {  # metafile -> the configs it lists
    'configs/soft/metafile.yml': ['configs/soft/*.py', 'configs/mmpretrain/soft-*.py'],
    'configs/xcit_sima/metafile.yml': ['configs/xcit_sima/*.py',
                                       'configs/mmpretrain/xcit-sima-*.py'],
}
TASKS = {  # codebase -> the (task, dataset, metric) a result of its configs may give
    'mmdet': {('Object Detection', 'COCO', 'box AP'),
              ('Instance Segmentation', 'COCO', 'mask AP')},
    'mmseg': {('Semantic Segmentation', 'ADE20K', 'mIoU')},
    'mmpretrain': {('Image Classification', 'ImageNet-1k', 'Top 1 Accuracy')},
}
TRAINING_DATA = {'CocoDataset': 'COCO', 'ADE20KDataset': 'ADE20K', 'ImageNet': 'ImageNet-1k'}


def load_yaml(path):
    with open(osp.join(ROOT, path)) as f:
        return yaml.safe_load(f)


INDEX = load_yaml('model-index.yml')
METAFILES = {path: load_yaml(path) for path in INDEX['Import']}
MODELS = [(path, model) for path, meta in METAFILES.items() for model in meta['Models']]


def test_index_imports_every_metafile():
    on_disk = sorted(osp.relpath(p, ROOT)
                     for p in glob.glob(osp.join(ROOT, 'configs', '*', 'metafile.yml')))
    assert sorted(INDEX['Import']) == on_disk == sorted(FAMILIES)


@pytest.mark.parametrize('metafile', sorted(FAMILIES))
def test_every_config_is_in_its_metafile_once(metafile):
    listed = Counter(model['Config'] for path, model in MODELS)
    shipped = sorted(osp.relpath(p, ROOT) for pattern in FAMILIES[metafile]
                     for p in glob.glob(osp.join(ROOT, pattern)))
    assert shipped
    mine = sorted(model['Config'] for model in METAFILES[metafile]['Models'])
    assert mine == shipped  # no config missing, none of another family, none twice
    assert all(listed[c] == 1 for c in shipped)
    for model in METAFILES[metafile]['Models']:
        assert osp.isfile(osp.join(ROOT, model['Config'])), model['Config']
        assert model['Name'] == osp.splitext(osp.basename(model['Config']))[0]


def test_names_unique_and_collections_known():
    names = [model['Name'] for _, model in MODELS]
    assert len(names) == len(set(names))
    collections = [c['Name'] for meta in METAFILES.values() for c in meta['Collections']]
    assert len(collections) == len(set(collections))
    for path, meta in METAFILES.items():
        own = {c['Name'] for c in meta['Collections']}
        for model in meta['Models']:
            assert model['In Collection'] in own, model['Name']
        for c in meta['Collections']:
            # as mmdet's metafiles: relative to the repository root
            assert c['README'] == osp.join(osp.dirname(path), 'README.md')
            assert osp.isfile(osp.join(ROOT, c['README']))
            assert set(c['Paper']) == {'URL', 'Title'}
            assert c['Paper']['URL'].startswith('https://arxiv.org/abs/')


def test_modelindex_loads_it_without_errors():
    """mim reads the index with modelindex, which records a broken import or an unknown
    collection as a check error instead of raising (the models would just be missing)."""
    from modelindex.load_model_index import load
    index = load(osp.join(ROOT, 'model-index.yml'))
    assert sorted(m.name for m in index.models) == sorted(m['Name'] for _, m in MODELS)
    # modelindex resolves README against the metafile's folder; mmdet's metafiles, and
    # these, name it from the repository root (checked above)
    errors = [e for e in index.check(silent=True) if 'Path to README file' not in e]
    assert not errors


@pytest.mark.parametrize('metafile,model', MODELS, ids=[m['Name'] for _, m in MODELS])
def test_metadata_matches_the_config(metafile, model):
    """Parameters agree with the model the config builds (within 0.05M); schedule, batch
    size, training data and the kinds of result agree with the config. No weights ship,
    and every result is a paper's, said so in the metadata."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    cfg = Config.fromfile(osp.join(ROOT, model['Config']))
    meta = model['Metadata']

    init_default_scope(cfg.default_scope)
    if 'data_preprocessor' in cfg:
        cfg.model.setdefault('data_preprocessor', cfg.data_preprocessor)
    registry = importlib.import_module(cfg.default_scope + '.registry').MODELS
    built = registry.build(cfg.model)  # no init_weights: the count does not need it
    n_params = sum(p.numel() for p in built.parameters())
    assert abs(n_params - meta['Parameters']) <= 0.05e6, (n_params, meta['Parameters'])
    if 'Paper Parameters' in meta:
        assert abs(meta['Parameters'] / meta['Paper Parameters'] - 1) < 0.02

    loop = cfg.train_cfg
    if 'max_iters' in loop:
        assert meta['Iterations'] == loop.max_iters and 'Epochs' not in meta
    else:
        dataset = cfg.train_dataloader.dataset
        times = dataset.times if dataset.type == 'RepeatDataset' else 1
        assert meta['Epochs'] == loop.max_epochs * times and 'Iterations' not in meta
    # the configs are written for 8 GPUs (auto_scale_lr names the total where it is set)
    total = cfg.get('auto_scale_lr', {}).get('base_batch_size',
                                             8 * cfg.train_dataloader.batch_size)
    assert meta['Batch Size'] == total
    assert meta['Training Data'] == TRAINING_DATA[cfg.dataset_type]
    assert meta['FLOPs'] > 0 and re.fullmatch(r'\d+x\d+', meta['FLOPs Input Size'])

    assert 'Weights' not in model
    results = model.get('Results', [])
    assert (meta.get('Results Source') == 'paper') == bool(results)
    kinds = {(r['Task'], r['Dataset'], metric) for r in results for metric in r['Metrics']}
    assert kinds <= TASKS[cfg.default_scope]
    with_mask = 'roi_head' in cfg.model and 'mask_head' in cfg.model.roi_head
    assert with_mask or all(metric != 'mask AP' for *_, metric in kinds)


def mim(*args, cwd):
    """`mim search mmsoft ...` with this venv's mim, from outside the repository."""
    exe = osp.join(osp.dirname(sys.executable), 'mim')
    res = subprocess.run([exe, 'search', 'mmsoft', *args], cwd=cwd, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return res.stdout


def test_mim_search_lists_every_model_with_its_metrics(tmp_path):
    out = mim(cwd=tmp_path)
    shown = {}  # config id -> {field: value as printed}
    for block in out.split('config id: ')[1:]:
        name, *lines = block.splitlines()
        shown[name.strip()] = dict(line.split(None, 1) for line in lines
                                   if line.strip() and not line.startswith('-'))
    assert sorted(shown) == sorted(m['Name'] for _, m in MODELS)
    for _, model in MODELS:
        fields = shown[model['Name']]
        assert fields['parameters'] == str(model['Metadata']['Parameters'])
        assert fields.get('results_source') == ('paper' if model.get('Results') else None)
        for result in model.get('Results', []):
            for metric, value in result['Metrics'].items():
                # mim names a metric <dataset>/<metric>, lower case, spaces as _
                key = f"{result['Dataset']}/{metric}".lower().replace(' ', '_')
                assert fields[key] == str(value), (model['Name'], key)


def test_mim_search_filters_by_collection(tmp_path):
    out = mim('--model', 'XCiT-SimA', '--valid-config', cwd=tmp_path)
    ids = ast.literal_eval(out.split('valid config ids:')[1].strip())
    assert sorted(ids) == sorted(m['Name'] for m in
                                 METAFILES['configs/xcit_sima/metafile.yml']['Models'])
