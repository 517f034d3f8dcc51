"""`mim download mmsoft` has no weights to fetch: it fails as docs/en/faq.md says, before
it downloads anything (so this test needs no network), and the FAQ points to where the
weights come from instead: the README's Weights section, the one place that says it."""
import os.path as osp
import re
import subprocess
import sys

from conftest import ROOT

# the end of mim's error that the FAQ quotes (mim finds no 'weight' field in the index)
MIM_ERROR = "but got {'weight'}"


def faq_entry():
    with open(osp.join(ROOT, 'docs', 'en', 'faq.md'), encoding='utf-8') as f:
        text = f.read()
    entry = re.search(r'\*\*`mim download mmsoft.*?(?=\n\*\*)', text, re.S)
    assert entry, 'docs/en/faq.md has no entry on `mim download mmsoft`'
    return entry.group(0)


def test_mim_download_fails_as_the_faq_says(tmp_path):
    entry = faq_entry()
    assert MIM_ERROR in entry
    assert 'README.md#weights' in entry and 'convert_checkpoint' in entry
    with open(osp.join(ROOT, 'README.md'), encoding='utf-8') as f:
        readme = f.read()
    weights = re.search(r'^## Weights\n(.*?)(?=^## )', readme, re.S | re.M)
    assert weights, 'README.md has no Weights section'
    for source in ('https://github.com/fudan-zvg/SOFT', 'https://dl.fbaipublicfiles.com/xcit/',
                   'checkpoints/soft_small_norm.pth'):
        assert source in weights.group(1)

    exe = osp.join(osp.dirname(sys.executable), 'mim')
    dest = tmp_path / 'dest'
    res = subprocess.run([exe, 'download', 'mmsoft', '--config', 'retinanet_soft-s_fpn_1x_coco',
                          '--dest', str(dest)], cwd=tmp_path, capture_output=True, text=True)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-2000:]
    assert MIM_ERROR in out, out[-2000:]
    assert not any(dest.iterdir())  # nothing downloaded, no config written
