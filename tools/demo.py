"""Run a trained detector or segmentor on photos and write them with the predictions drawn.

Uses MMDetection's ``DetInferencer`` (boxes, instance masks) or MMSegmentation's
``MMSegInferencer`` (segmentation overlay), chosen from the config's ``default_scope``.

Examples:
  python tools/demo.py photo.jpg configs/_mini_/retinanet_soft-t_fpn_mini-coco.py work_dirs/quickstart/iter_400.pth
  python tools/demo.py photos/ CONFIG CHECKPOINT --out-dir demo_out --score-thr 0.5
  python tools/demo.py astronaut CONFIG CHECKPOINT     # a scikit-image sample photo

IMAGE is a file, a folder of images, or a scikit-image sample name (astronaut, coffee,
chelsea, rocket, ...). Results go to OUT_DIR/vis (drawn images) and OUT_DIR/preds (JSON).
"""
import glob
import os
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

IMAGE_EXTS = ('.jpg', '.jpeg', '.png', '.bmp', '.webp', '.tif', '.tiff')


def collect_images(source, tmp_dir):
    """Paths of the images to run on (sample names are written to ``tmp_dir`` first)."""
    if osp.isdir(source):
        paths = sorted(p for p in glob.glob(osp.join(source, '*'))
                       if p.lower().endswith(IMAGE_EXTS))
        if not paths:
            raise FileNotFoundError(f'no images in {source}')
        return paths
    if osp.isfile(source):
        return [source]
    from PIL import Image

    from mmsoft.analysis import load_image
    os.makedirs(tmp_dir, exist_ok=True)
    path = osp.join(tmp_dir, f'{source}.png')
    Image.fromarray(load_image(source)).save(path)
    return [path]


def main(argv=None):
    from mmsoft.analysis import tool_parser
    parser = tool_parser(__doc__)
    parser.add_argument('image', help='image file, folder, or scikit-image sample name')
    parser.add_argument('config', help='config file')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--out-dir', default='demo_out')
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--score-thr', type=float, default=0.3,
                        help='detections below this score are not drawn')
    args = parser.parse_args(argv)

    import mmsoft  # noqa: F401  (registers the backbones before the model is built)
    from mmengine.config import Config
    scope = Config.fromfile(args.config).get('default_scope', 'mmdet')
    images = collect_images(args.image, osp.join(args.out_dir, 'inputs'))
    if scope == 'mmdet':
        from mmdet.apis import DetInferencer
        inferencer = DetInferencer(model=args.config, weights=args.checkpoint,
                                   device=args.device, show_progress=True)
        results = inferencer(images, out_dir=args.out_dir, pred_score_thr=args.score_thr,
                             no_save_pred=False, return_datasamples=False)
    elif scope == 'mmseg':
        from mmseg.apis import MMSegInferencer
        inferencer = MMSegInferencer(model=args.config, weights=args.checkpoint,
                                     device=args.device)
        results = inferencer(images, out_dir=args.out_dir, return_datasamples=False)
    else:
        raise ValueError(f'demo supports mmdet and mmseg configs, not {scope!r}')
    print(f'wrote {len(images)} visualizations to {osp.join(args.out_dir, "vis")}')
    return results


if __name__ == '__main__':
    main()
