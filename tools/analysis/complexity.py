"""Parameters and FLOPs of backbones and shipped configs, counting what generic counters skip.

mmengine's counter (fvcore-style jit tracing) counts convolutions and linear layers but not
the inside of SOFT's attention the way the paper defines it: it sees whatever kernels the
implementation happens to call (e.g. an eigendecomposition it does not count at all), and
it cannot know that the pseudo-inverse is 20 Newton–Raphson iterations. This tool prints
both numbers:

  mmengine   what ``mmengine.analysis.FlopAnalyzer`` reports for one forward pass
  ours       mmengine's count with every SOFT kernel-attention core replaced by its
             analytic count: the Gaussian kernels P (N×m) and A (m×m), the α search,
             T Newton–Raphson steps (2 m×m products each), normalization and P·(Â·(Pᵀ·V))
             (its landmark and depthwise convolutions stay as mmengine counts them);
             SimA's products are counted by mmengine already (plain matmuls)

All counts are multiply-accumulates (1 MAC = 1 "FLOP" in the detection literature, as in
the papers' tables). Usage:

  python tools/analysis/complexity.py configs/soft/retinanet_soft-t_fpn_1x_coco.py --shape 800 1280
  python tools/analysis/complexity.py --backbone SOFT:small --shape 224 224
  python tools/analysis/complexity.py --all-configs --shape 512 512 --markdown
"""
import glob
import os.path as osp
import sys

import torch

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def soft_attention_macs(B, h, N, m, d, iters):
    """Analytic MACs of one SOFT kernel-attention core (SPEC 1.1), batch B, h heads."""
    per_head = (
        N * m * d  # P = κ(Q, Q̃): the Q·Q̃ᵀ product (norms and exp are O(N·m))
        + m * m * d  # A = κ(Q̃, Q̃)
        + m**3  # A·A for the α search
        + iters * 2 * m**3  # V_{k+1} = 2V_k − V_k·(A·V_k)
        + N * m * d  # Pᵀ·V
        + m * m * d  # Â·(Pᵀ·V)
        + N * m * d)  # P·(…)
    return B * h * per_head


class _AttentionRecorder:
    """Forward hooks on SOFT's kernel-attention modules: shapes seen in one pass."""

    def __init__(self, model):
        from mmsoft.models.backbones.soft import SoftKernelAttention
        self.records = {}
        self.handles = []
        for name, mod in model.named_modules():
            if isinstance(mod, SoftKernelAttention):
                self.handles.append(mod.register_forward_hook(self._hook(name)))

    def _hook(self, name):

        def hook(mod, inputs, output):
            q, _, hw = inputs
            B, h, N, d = q.shape
            r = mod.sr_ratio
            gh, gw = hw[0] // r, hw[1] // r
            if mod.landmark_grid is not None:
                gh, gw = min(gh, mod.landmark_grid), min(gw, mod.landmark_grid)
            self.records[name] = soft_attention_macs(B, h, N, gh * gw, d, mod.newton_iters)

        return hook

    def remove(self):
        for h in self.handles:
            h.remove()


def count(model, inputs):
    """(params, mmengine MACs, our MACs) of ``model(inputs)``."""
    from mmengine.analysis import FlopAnalyzer
    params = sum(p.numel() for p in model.parameters())
    recorder = _AttentionRecorder(model)
    with torch.no_grad():
        model(inputs)  # records the attention shapes
    recorder.remove()
    analyzer = FlopAnalyzer(model, inputs)
    analyzer.unsupported_ops_warnings(False)
    analyzer.uncalled_modules_warnings(False)
    with torch.no_grad():  # the trace runs a forward: keep autograd from holding every P
        total = analyzer.total()
        by_module = analyzer.by_module()
    ours = total
    for name, macs in recorder.records.items():
        # keep the module's convolutions (landmark conv, depthwise conv on V) as counted
        convs = by_module.get(f'{name}.Qlandmark_op', 0) + by_module.get(f'{name}.conv', 0)
        ours += macs + convs - by_module.get(name, 0)
    return params, total, ours


class _TensorForward(torch.nn.Module):
    """A detector / segmentor / classifier as a tensor -> tensors module."""

    def __init__(self, model, scope):
        super().__init__()
        self.model = model
        self.scope = scope

    def forward(self, x):
        samples = None
        if self.scope == 'mmdet':  # two-stage detectors read the image shape from metas
            from mmdet.structures import DetDataSample
            from mmengine.structures import InstanceData
            shape = tuple(x.shape[-2:])
            samples = [DetDataSample(
                metainfo=dict(img_shape=shape, ori_shape=shape, pad_shape=shape,
                              batch_input_shape=shape, scale_factor=(1., 1.)),
                gt_instances=InstanceData(bboxes=x.new_zeros(0, 4),
                                          labels=x.new_zeros(0, dtype=torch.long)))
                for _ in range(x.shape[0])]
        return self.model(x, samples, mode='tensor')


def build_from_config(path):
    from mmengine.config import Config

    from mmsoft.analysis import build_model_from_config
    cfg = Config.fromfile(path)
    return _TensorForward(build_model_from_config(cfg).eval(), cfg.default_scope)


def fmt_g(x):
    return f'{x / 1e9:.1f}G'


def main(argv=None):
    from mmsoft.analysis import tool_parser
    parser = tool_parser(__doc__)
    parser.add_argument('config', nargs='*', help='config file(s)')
    parser.add_argument('--backbone', action='append', default=[],
                        help='FAMILY:ARCH, e.g. SOFT:small or XCiTSimA:s12')
    parser.add_argument('--all-configs', action='store_true',
                        help='every config under configs/ (except _base_ and _mini_)')
    parser.add_argument('--shape', nargs=2, type=int, default=[800, 1280], metavar=('H', 'W'))
    parser.add_argument('--markdown', action='store_true', help='print a markdown table')
    args = parser.parse_args(argv)
    from mmsoft.analysis import build_backbone
    items = [(b, lambda b=b: build_backbone(b)) for b in args.backbone]
    paths = list(args.config)
    if args.all_configs:
        paths += sorted(p for p in glob.glob(osp.join(ROOT, 'configs', '**', '*.py'),
                                             recursive=True)
                        if '_base_' not in p and '_mini_' not in p)
    items += [(osp.relpath(p, ROOT), lambda p=p: build_from_config(p)) for p in paths]
    if not items:
        parser.error('give config files, --backbone or --all-configs')
    h, w = args.shape
    rows = []
    try:
        from tqdm import tqdm
        it = tqdm(items, desc='counting', file=sys.stderr)
    except ImportError:
        it = items
    for name, builder in it:
        model = builder()
        shape = (h, w) if 'mmpretrain' not in name else (224, 224)
        params, mm, ours = count(model, torch.randn(1, 3, *shape))
        rows.append((name, shape, params, mm, ours))
    if args.markdown:
        print('| model | input | params | MACs, mmengine counter | MACs, ours |')
        print('|---|---|---|---|---|')
        for name, shape, params, mm, ours in rows:
            print(f'| {name} | {shape[0]}×{shape[1]} | {params / 1e6:.1f}M | {fmt_g(mm)} | '
                  f'{fmt_g(ours)} |')
    else:
        for name, shape, params, mm, ours in rows:
            print(f'{name}: input {shape[0]}x{shape[1]}, params {params / 1e6:.2f}M, '
                  f'mmengine {fmt_g(mm)} MACs, ours {fmt_g(ours)} MACs')
    return rows


if __name__ == '__main__':
    main()
