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
the papers' tables). The weights do not change the counts: the models are built untrained
(no --checkpoint). The console shows a progress bar and the results; the models' own log
lines (mmengine prints one init notice per parameter) go to --log-file.

Examples:
  python tools/analysis_tools/complexity.py --config configs/_mini_/retinanet_soft-t_fpn_mini-coco.py --shape 128 128
  python tools/analysis_tools/complexity.py --config configs/soft/retinanet_soft-t_fpn_1x_coco.py --shape 800 1280
  python tools/analysis_tools/complexity.py --backbone SOFT:small --shape 224 224
  python tools/analysis_tools/complexity.py --all-configs --shape 800 1280 --markdown

RUN_TIME
"""
import contextlib
import glob
import os
import os.path as osp
import sys
import textwrap

import torch

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))  # configs/ beside tools/
# Measured on a 2-core CPU (CPU seconds: SOFT-T RetinaNet 127, SOFT-L Mask R-CNN 492,
# XCiT-SimA-S12 Mask R-CNN 33, at 800×1280).
ALL_CONFIGS_TIME = ('--all-configs (27 configs) at 800×1280 takes about an hour on a 2-core '
                    'CPU: 2 (SOFT-T) to 8 (SOFT-L) minutes per SOFT detection or '
                    'segmentation config, about half a minute per XCiT-SimA config, seconds '
                    'per ImageNet config; up to 3 GB of memory')


def soft_attention_macs(B, h, N, m, d, iters):
    """Analytic MACs of one SOFT kernel-attention core (SOFT, IJCV 2024: Eq. 5, Alg. 2,
    Eq. 25), batch B, h heads."""
    per_head = (
        N * m * d  # P = κ(Q, Q̃): the Q·Q̃ᵀ product (norms and exp are O(N·m))
        + m * m * d  # A = κ(Q̃, Q̃)
        + m**3  # A·A for the α search
        + iters * 2 * m**3  # V_{k+1} = 2V_k − V_k·(A·V_k)
        + N * m * d  # Pᵀ·V
        + m * m * d  # Â·(Pᵀ·V)
        + N * m * d)  # P·(…)
    return B * h * per_head


def attention_macs(model, inputs):
    """{layer name: analytic MACs of its SOFT kernel-attention core} for ``model(inputs)``,
    with the shapes (and so the landmark count m) the layers actually ran with."""
    from mmsoft.analysis import soft_attention_inputs
    out = {}
    for name, (mod, q, landmarks, _) in soft_attention_inputs(model, inputs).items():
        B, h, N, d = q.shape
        out[name] = soft_attention_macs(B, h, N, landmarks.shape[-2], d, mod.newton_iters)
    return out


def count(model, inputs):
    """(params, mmengine MACs, our MACs, per-layer our MACs) of ``model(inputs)``; a
    layer's MACs are its analytic core plus its convolutions as mmengine counts them."""
    from mmengine.analysis import FlopAnalyzer
    params = sum(p.numel() for p in model.parameters())
    cores = attention_macs(model, inputs)
    analyzer = FlopAnalyzer(model, inputs)
    analyzer.unsupported_ops_warnings(False)
    analyzer.uncalled_modules_warnings(False)
    with torch.no_grad():  # the trace runs a forward: keep autograd from holding every P
        total = analyzer.total()
        by_module = analyzer.by_module()
    layers = {}
    for name, macs in cores.items():
        # keep the module's convolutions (landmark conv, depthwise conv on V) as counted
        convs = by_module.get(f'{name}.Qlandmark_op', 0) + by_module.get(f'{name}.conv', 0)
        layers[name] = macs + convs
    ours = total + sum(layers[n] - by_module.get(n, 0) for n in layers)
    return params, total, ours, layers


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
            shape = tuple(int(s) for s in x.shape[-2:])  # torch 2.1's tracer: not tensors
            samples = [DetDataSample(
                metainfo=dict(img_shape=shape, ori_shape=shape, pad_shape=shape,
                              batch_input_shape=shape, scale_factor=(1., 1.)),
                gt_instances=InstanceData(bboxes=x.new_zeros(0, 4),
                                          labels=x.new_zeros(0, dtype=torch.long)))
                for _ in range(x.shape[0])]
        return self.model(x, samples, mode='tensor')


def build_from_config(path):
    from mmengine.config import Config

    from mmsoft.apis import init_model
    cfg = Config.fromfile(path)
    # the initialization log goes to --log-file on purpose (init_model keeps it back)
    return _TensorForward(init_model(cfg, log_level='INFO').eval(), cfg.default_scope)


def fmt_g(x):
    return f'{x / 1e9:.1f}G'


@contextlib.contextmanager
def logs_to_file(path):
    """Everything the models print while being built and counted (mmengine's log lines,
    e.g. one init_weights notice per parameter, Python warnings, prints) goes to ``path``
    instead of the console, where only the progress bar and the results stay."""
    import logging
    import warnings

    from mmengine.logging import MMLogger
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    with open(path, 'w') as f, warnings.catch_warnings(), contextlib.redirect_stdout(f):
        warnings.showwarning = (lambda message, category, filename, lineno, file=None,
                                line=None: f.write(warnings.formatwarning(
                                    message, category, filename, lineno, line)))
        # mmengine logs through its current MMLogger, whose console handler holds the
        # real stdout: point that handler at the file.
        handlers = [(h, h.stream) for h in MMLogger.get_current_instance().handlers
                    if isinstance(h, logging.StreamHandler)
                    and not isinstance(h, logging.FileHandler)]
        for h, _ in handlers:
            h.setStream(f)
        try:
            yield
        finally:
            for h, stream in handlers:
                h.setStream(stream)


def build_parser():
    """The argument parser of this tool (its help says how long --all-configs runs)."""
    from mmsoft.apis.cli import tool_parser
    run_time = textwrap.fill('Run time: one forward pass and one traced pass per model, on '
                             f'CPU. {ALL_CONFIGS_TIME}.', 90)
    parser = tool_parser(__doc__.replace('RUN_TIME', run_time))
    parser.add_argument('configs', nargs='*', metavar='CONFIG', help='config file(s)')
    parser.add_argument('--config', action='append', default=[],
                        help='a config file (repeatable; same as CONFIG)')
    parser.add_argument('--backbone', action='append', default=[],
                        help='FAMILY:ARCH, e.g. SOFT:small or XCiTSimA:s12 (repeatable)')
    parser.add_argument('--all-configs', action='store_true',
                        help='every config under configs/ (except _base_ and _mini_); '
                        'takes about an hour, see below')
    parser.add_argument('--shape', nargs=2, type=int, default=[800, 1280], metavar=('H', 'W'))
    parser.add_argument('--markdown', action='store_true', help='print a markdown table')
    parser.add_argument('--log-file',
                        default=osp.join('work_dirs', 'complexity', 'complexity.log'),
                        help='where the models\' log lines go (default %(default)s)')
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    from mmsoft.apis import init_backbone
    items = [(b, lambda b=b: init_backbone(b)) for b in args.backbone]
    paths = list(args.configs) + list(args.config)
    if args.all_configs:
        paths += sorted(p for p in glob.glob(osp.join(ROOT, 'configs', '**', '*.py'),
                                             recursive=True)
                        if '_base_' not in p and '_mini_' not in p)
    items += [(osp.relpath(p, ROOT), lambda p=p: build_from_config(p)) for p in paths]
    if not items:
        parser.error('give config files, --backbone or --all-configs')
    h, w = args.shape
    rows = []
    from tqdm import tqdm
    bar = tqdm(items, desc='counting', file=sys.stderr, unit='model')
    print(f'log lines of the models go to {args.log_file}', file=sys.stderr)
    with logs_to_file(args.log_file):
        for name, builder in bar:
            bar.set_postfix_str(name, refresh=True)
            model = builder()
            shape = (h, w) if 'mmpretrain' not in name else (224, 224)
            params, mm, ours, _ = count(model, torch.randn(1, 3, *shape))
            rows.append((name, shape, params, mm, ours))
            del model
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
