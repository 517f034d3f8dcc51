"""Attention maps on a photo, saved as PNG overlays.

- SOFT: for a query patch, the attention row P·Â·Pᵀ over the image, one PNG per head of
  the chosen layer (the SOFT paper's Fig. 3 / 6 style).
- XCiT-SimA: SimA's token importance, the L2 norm of the normalized q̂ (and k̂) of every
  token, per head and averaged (the SimA paper's Fig. 3).

Examples:
  python tools/analysis/attention_maps.py --backbone SOFT:small --checkpoint soft_small.pth \\
      --image astronaut --layer block3.0.att.mha.attn --query 0.3 0.45 --out-dir vis
  python tools/analysis/attention_maps.py --config configs/xcit_sima/mask-rcnn_xcit-sima-s12-p16_fpn_ms-crop-3x_coco.py \\
      --checkpoint work_dirs/x/epoch_36.pth --image photo.jpg --layer blocks.7.attn --out-dir vis

--image takes a file or a scikit-image sample name (astronaut, coffee, chelsea, rocket, ...);
--layer defaults to the first attention layer; the tool lists the valid names if it is wrong.
"""
import os
import os.path as osp
import sys

from PIL import Image

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))


def main(argv=None):
    from mmsoft import analysis
    from mmsoft.models import SOFT
    from mmsoft.models.backbones.xcit_sima import SimAAttention

    parser = analysis.tool_parser(__doc__)
    analysis.add_backbone_args(parser)
    parser.add_argument('--image', default='astronaut', help='file or scikit-image sample')
    parser.add_argument('--size', type=int, default=448, help='short side of the input')
    parser.add_argument('--layer', help='attention module name (default: first)')
    parser.add_argument('--query', nargs=2, type=float, default=[0.5, 0.5],
                        metavar=('Y', 'X'), help='SOFT query position, fractions of H, W')
    parser.add_argument('--out-dir', default='attention_maps')
    args = parser.parse_args(argv)

    model = analysis.build_backbone(args.backbone, args.config, args.checkpoint)
    image = analysis.load_image(args.image, args.size)
    x = analysis.to_tensor(image)
    os.makedirs(args.out_dir, exist_ok=True)
    stem = osp.splitext(osp.basename(str(args.image)))[0]
    written = []

    def save(heat, name):
        path = osp.join(args.out_dir, f'{stem}_{name}.png')
        Image.fromarray(analysis.overlay(image, heat)).save(path)
        written.append(path)

    if isinstance(model, SOFT):
        layer = args.layer or analysis.soft_layers(model, x)[0]
        rows = analysis.soft_attention_rows(model, x, layer, args.query)[0]
        for h, heat in enumerate(rows):
            save(heat, f'{layer}_q{args.query[0]:.2f}-{args.query[1]:.2f}_head{h}')
    else:
        layer = args.layer or next(n for n, m in model.named_modules()
                                   if isinstance(m, SimAAttention))
        q_maps, k_maps = analysis.sima_token_importance(model, x, layer)
        for kind, maps in (('q', q_maps[0]), ('k', k_maps[0])):
            for h, heat in enumerate(maps):
                save(heat, f'{layer}_{kind}-norm_head{h}')
            save(maps.mean(0), f'{layer}_{kind}-norm_mean')
    print(f'wrote {len(written)} overlays to {args.out_dir}')
    return written


if __name__ == '__main__':
    main()
