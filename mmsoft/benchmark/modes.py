"""SOFT's attention modes (``SOFT_MODES``): each mode's time on SOFT-S at the largest
``--sizes`` entry and its deviation from the float64 20-step iterate (the exact answer)
on the parity fixture input and on a real photo (scikit-image's astronaut), and from the
outputs the official code produced for the fixture (tests/data/).

'official order' runs SOFT's attention in the official computation order
(``mmsoft.testing.official_order``); the exact methods ('iterative', 'spectral', 'tf32',
'auto': what the plan's ``pinv`` picks) compute the same iterate.
"""
import torch

from .common import (SOFT_MODES, build, fmt, measure, mode_plan, parse_size, repo_file,
                     soft_modes)


def _fixture_soft(**kwargs):
    """The parity fixture's SOFT (official weights, random) in eval mode."""
    from mmsoft.models import SOFT
    fixture = repo_file('tests/data/soft_public_checkpoint.pth')
    arch = dict(embed_dims=[32, 64, 96, 128], num_heads=[1, 2, 3, 4], depths=[1, 1, 2, 1])
    model = SOFT(arch=arch, drop_path_rate=0., init_cfg=dict(type='Pretrained',
                                                               checkpoint=fixture), **kwargs)
    model.init_weights()
    return model.eval()


def section_modes(args, out):
    """Each mode's deviation from the float64 20-step iterate (the exact answer) and,
    on the fixture input, from the outputs the official code produced."""
    from mmsoft.testing import relative_deviation
    expected = torch.load(repo_file('tests/data/soft_public_expected.pth'))
    official = [expected[k] for k in ('stage1', 'stage2', 'stage3', 'stage4_norm')]
    inputs = {'fixture 128×160': expected['input']}
    try:
        from skimage import data as skdata
        photo = torch.from_numpy(skdata.astronaut()).permute(2, 0, 1).float()[None]
        photo = (photo - photo.mean()) / photo.std()
        inputs['astronaut 800×800'] = torch.nn.functional.interpolate(
            photo, size=(800, 800), mode='bilinear')
    except ImportError:
        pass
    # The float64 iterate (eigh and the iterations agree to ~1e-12 in float64; eigh is
    # far cheaper at the photo's m ≈ 1000).
    model_ref = _fixture_soft(pinv_method='spectral').double()
    with torch.no_grad():
        refs = {k: model_ref(x.double()) for k, x in inputs.items()}
    hw = parse_size(args.sizes[-1])
    lines = [f'| mode | what | SOFT-S time @{args.sizes[-1]} | ' +
             ' | '.join(f'max rel. deviation from the float64 iterate, {k}'
                        for k in inputs) + ' | vs official outputs, fixture |',
             '|---|---|---|' + '---|' * (len(inputs) + 1)]
    rows = {}
    for mode, (kwargs, _, what) in SOFT_MODES.items():
        is_official = mode == 'official order'
        if is_official and args.skip_official:
            continue
        model = _fixture_soft(**kwargs)
        devs = []
        with torch.no_grad(), mode_plan(mode):
            for k, x in inputs.items():
                outs = model(x)
                devs.append(max(map(relative_deviation, outs, refs[k])))
                if k.startswith('fixture'):
                    dev_official = max(map(relative_deviation, outs, official))
        t = None
        if mode in soft_modes(args, [mode]):
            t = measure(build('SOFT-S', mode), hw, args.device,
                        0 if is_official else args.repeat, mode=mode)
        rows[mode] = dict(time=t, deviation=devs, official=dev_official)
        lines.append(f'| {mode} | {what} | {fmt(t) if t else "– (emulated)"} | ' +
                     ' | '.join(f'{d:.1e}' for d in devs) + f' | {dev_official:.1e} |')
        print(f'  mode {mode} done', flush=True)
    out['modes'] = rows
    return lines
