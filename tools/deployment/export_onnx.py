"""Export a SOFT or XCiT-SimA backbone to ONNX (dynamic batch and input size) and check it
against onnxruntime on CPU.

SOFT is traced with the 20 Newton–Raphson matrix iterations ('iterative'): ONNX has no
eigendecomposition operator, and every exact method ('auto', 'iterative', 'spectral',
'tf32') computes the same iterate; the model keeps its own method afterwards, and the check
compares onnxruntime with it. The fast mode 'regularized' is a different function (a linear
solve, no ONNX operator) and is refused. Without --out the file goes to work_dirs/onnx/.

Examples:
  python tools/deployment/export_onnx.py --backbone SOFT:small --checkpoint soft_small.pth
  python tools/deployment/export_onnx.py --config configs/xcit_sima/mask-rcnn_xcit-sima-s12-p16_fpn_ms-crop-3x_coco.py \\
      --check-sizes 224x224 480x640
"""
import inspect
import os
import os.path as osp
import warnings

import torch

from mmsoft.apis import cli


def export(model, path, sample_hw=(224, 224), opset=17):
    """Trace ``model`` to ``path``. SOFT layers are traced with the 'iterative' method and
    get their own method back afterwards; the fast mode 'regularized' computes a different
    function that ONNX cannot express (a linear solve) and is refused."""
    from mmsoft.models.backbones.soft import SoftKernelAttention
    layers = [m for m in model.modules() if isinstance(m, SoftKernelAttention)]
    methods = [m.pinv_method for m in layers]
    if 'regularized' in methods:
        raise ValueError("pinv_method='regularized' cannot be exported to ONNX (it needs a "
                         'linear solve); export the model with the default method')
    x = torch.randn(1, 3, *sample_hw)
    # the TorchScript exporter: torch >= 2.5 has a dynamo one too, chosen by `dynamo`
    legacy_exporter = ({'dynamo': False} if 'dynamo' in inspect.signature(
        torch.onnx.export).parameters else {})
    try:
        for m in layers:  # every other method computes the same 20-step iterate
            m.pinv_method = 'iterative'
        with warnings.catch_warnings(), torch.no_grad():
            n_out = len(model(x))
            warnings.simplefilter('ignore')  # tracer warnings about shape arithmetic
            torch.onnx.export(
                model, (x, ), path, opset_version=opset, input_names=['input'],
                output_names=[f'out{i}' for i in range(n_out)],
                dynamic_axes={'input': {0: 'batch', 2: 'height', 3: 'width'},
                              **{f'out{i}': {0: 'batch', 2: f'h{i}', 3: f'w{i}'}
                                 for i in range(n_out)}},
                **legacy_exporter)
    finally:
        for m, method in zip(layers, methods):
            m.pinv_method = method
    return path


def check(model, path, sizes):
    """Max relative deviation (max|ort − torch| / max|torch|) per size, worst output."""
    import onnxruntime as ort
    sess = ort.InferenceSession(path, providers=['CPUExecutionProvider'])
    result = {}
    for hw in sizes:
        x = torch.randn(1, 3, *hw)
        with torch.no_grad():
            ref = model(x)
        outs = sess.run(None, {'input': x.numpy()})
        result[hw] = max(float((torch.from_numpy(o) - r).abs().max() / r.abs().max())
                         for o, r in zip(outs, ref))
    return result


def build_parser():
    """The argument parser of this tool."""
    parser = cli.tool_parser(__doc__)
    cli.add_model_args(parser)
    parser.add_argument('--out', default=None,
                        help='output .onnx file (default: work_dirs/onnx/<model>.onnx)')
    parser.add_argument('--opset', type=int, default=17)
    parser.add_argument('--check-sizes', nargs='+', default=['224x224', '320x480'],
                        help='input sizes compared with onnxruntime (HxW)')
    parser.add_argument('--tolerance', type=float, default=1e-4)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.opset < 17:
        parser.error('--opset must be >= 17 (LayerNormalization)')
    model, _ = cli.backbone_from_args(args)
    if args.out is None:
        name = (osp.splitext(osp.basename(args.config))[0] if args.config
                else args.backbone.replace(':', '_').lower())
        args.out = osp.join('work_dirs', 'onnx', f'{name}.onnx')
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    export(model, args.out, opset=args.opset)
    sizes = [tuple(int(v) for v in s.lower().split('x')) for s in args.check_sizes]
    devs = check(model, args.out, sizes)
    for hw, dev in devs.items():
        print(f'onnxruntime vs torch at {hw[0]}x{hw[1]}: max relative deviation {dev:.2e}')
    if max(devs.values()) > args.tolerance:
        raise SystemExit(f'deviation above {args.tolerance}')
    print(f'wrote {args.out}')
    return devs


if __name__ == '__main__':
    main()
