"""Attention maps on an image, saved as PNG figures (title, colorbar, query marker).

- SOFT: for a query token (marked +), its attention row P·Â·Pᵀ over the image, one PNG
  per head of the chosen layer (the SOFT paper's Fig. 3 / 6 style).
- XCiT-SimA: SimA's token importance, the L2 norm of the normalized q̂ (and k̂) of every
  token, per head and averaged (the SimA paper's Fig. 3).

Examples:
  # after bash scripts/quickstart.sh: its SOFT-Tiny on a mini-set image (it saw only shapes)
  python tools/analysis_tools/attention_maps.py --config configs/_mini_/retinanet_soft-t_fpn_mini-coco.py \\
      --checkpoint work_dirs/quickstart --query 0.3 0.45
  # official ImageNet weights (docs/en/user_guides/checkpoints.md) on a photo
  python tools/analysis_tools/attention_maps.py --backbone SOFT:small --checkpoint checkpoints/soft_small_norm.pth \\
      --image astronaut --layer block3.0.att.mha.attn --query 0.3 0.45
  python tools/analysis_tools/attention_maps.py --backbone XCiTSimA:s12 \\
      --checkpoint checkpoints/xcit_small_12_p16_224.pth --image coffee --layer blocks.7.attn

--image takes a file or a scikit-image sample name (astronaut, coffee, chelsea, rocket, ...);
its default is the config's first test image when it exists, else astronaut. --layer
defaults to the first attention layer; the tool lists the valid names if it is wrong.
Without --checkpoint the weights are random: the tool warns and every title says so.
PNGs go to work_dirs/attention_maps/ unless --out-dir says otherwise.
"""
import os
import os.path as osp

from mmsoft import visualization
from mmsoft.apis import cli, inference

SIMA_RANDOM = (': untrained, the token norms mostly light up a border of the image (the '
               'convolutions\' zero padding sets the border tokens apart), not its content')


def build_parser():
    """The argument parser of this tool."""
    parser = cli.tool_parser(__doc__)
    cli.add_model_args(parser)
    parser.add_argument('--image', help='file or scikit-image sample (default: see below)')
    parser.add_argument('--size', type=int,
                        help='short side of the input (default: the image\'s, at most 512)')
    parser.add_argument('--layer', help='attention module name (default: first)')
    parser.add_argument('--query', nargs=2, type=float, default=[0.5, 0.5],
                        metavar=('Y', 'X'), help='SOFT query position, fractions of H, W')
    parser.add_argument('--out-dir', default=osp.join('work_dirs', 'attention_maps'))
    return parser


def main(argv=None):
    from mmsoft import analysis
    from mmsoft.models import SOFT

    args = build_parser().parse_args(argv)
    cli.setup_logging()

    model, weights = cli.backbone_from_args(args)
    is_soft = isinstance(model, SOFT)
    if weights == cli.RANDOM_WEIGHTS and not is_soft:
        cli.logger.warning('XCiT-SimA maps from random weights' + SIMA_RANDOM)
    source = args.image or inference.default_images(args.config, 1, ['astronaut'])[0]
    image = inference.load_image(source)
    size = args.size or min(min(image.shape[:2]), 512)
    if size != min(image.shape[:2]):
        image = inference.load_image(source, size)
    x = inference.to_tensor(image)
    os.makedirs(args.out_dir, exist_ok=True)
    stem = osp.splitext(osp.basename(str(source)))[0]
    cli.logger.info(f'image {inference.describe(source)}, short side {size}')
    head_line = (f'{cli.model_name(args)} · {weights} · '
                 f'image {osp.basename(str(source))}')
    written = {}

    def save(heat, name, title, label, marker=None):
        fig = visualization.map_figure(image, heat, f'{head_line}\n{title}', label, marker)
        path = osp.join(args.out_dir, f'{stem}_{name}.png')
        fig.savefig(path, bbox_inches='tight', pad_inches=0.1)
        written[path] = fig

    if is_soft:
        layer = args.layer or analysis.soft_layers(model, x)[0]
        rows = analysis.soft_attention_rows(model, x, layer, args.query)[0]
        H, W = rows.shape[-2:]
        i, j = analysis.query_token(args.query, (H, W))
        marker = ((i + 0.5) * image.shape[0] / H, (j + 0.5) * image.shape[1] / W)
        qy, qx = args.query
        for h, heat in enumerate(rows):
            save(heat, f'{layer}_q{qy:.2f}-{qx:.2f}_head{h}',
                 f'{layer} · head {h}\nattention of the query token + at '
                 f'(y, x) = ({qy:.2f}, {qx:.2f})', 'attention weight (row of P·Â·Pᵀ)',
                 marker)
    else:
        layer = args.layer or analysis.sima_layers(model, x)[0]
        q_maps, k_maps = analysis.sima_token_importance(model, x, layer)
        for kind, maps in (('q', q_maps[0]), ('k', k_maps[0])):
            label = rf'$\|\hat{{{kind}}}\|_2$ of the token (SimA token importance)'
            for h, heat in enumerate(maps):
                save(heat, f'{layer}_{kind}-norm_head{h}', f'{layer} · head {h}', label)
            save(maps.mean(0), f'{layer}_{kind}-norm_mean', f'{layer} · mean over heads',
                 label)
    print(f'wrote {len(written)} figures to {args.out_dir}')
    return written


if __name__ == '__main__':
    main()
