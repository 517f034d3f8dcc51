"""Run a detector or segmentor on images and write them with the predictions drawn.

Uses MMDetection's ``init_detector`` / ``inference_detector`` (boxes, instance masks) or
MMSegmentation's ``init_model`` / ``inference_model`` (class overlay and legend), chosen
from the config's ``default_scope``; the pictures are drawn here, with every label kept
inside the image and clear of the others.

Examples:
  # after bash scripts/quickstart.sh: the mini detector on its own validation images
  python tools/misc/demo.py --config configs/_mini_/retinanet_soft-t_fpn_mini-coco.py --checkpoint work_dirs/quickstart
  python tools/misc/demo.py photos/ --config CONFIG --checkpoint CHECKPOINT --score-thr 0.5

IMAGE (any number) is a file, a folder of images or a scikit-image sample name (astronaut,
coffee, chelsea, rocket, ...). Without IMAGE the demo runs on the first --num-images images
of the config's test set, the kind of image the model was trained for: the mini configs'
models know only the generated shapes (rectangle, ellipse), so on a photo such as
'astronaut' (a person) they find nothing meaningful. Without --checkpoint the weights are
random: the demo warns and every picture says so. Pictures go to OUT_DIR/vis, predictions
(JSON for detection, label-map PNGs for segmentation) to OUT_DIR/preds; OUT_DIR defaults to
work_dirs/demo.
"""
import glob
import json
import os
import os.path as osp
import warnings

import numpy as np

from mmsoft import visualization
from mmsoft.apis import cli, inference

DISPLAY_SIDE = 512  # small images are drawn enlarged to this long side, so labels fit


def collect_images(sources):
    """(name, source) of every input; folders expand to their images."""
    out = []
    for source in sources:
        if osp.isdir(source):
            paths = sorted(p for p in glob.glob(osp.join(source, '*'))
                           if p.lower().endswith(inference.IMAGE_EXTS))
            if not paths:
                raise FileNotFoundError(f'no images in {source}')
            out += [(osp.splitext(osp.basename(p))[0], p) for p in paths]
        else:
            out.append((osp.splitext(osp.basename(source))[0], source))
    return out


def _canvas(image, title_lines, extra_bottom=0.):
    """A figure showing ``image`` at a known scale (display pixels per image pixel) under
    a title; returns (fig, ax, scale)."""
    H, W = image.shape[:2]
    dpi = 100
    scale = max(1., DISPLAY_SIDE / max(H, W))
    title_h = 0.12 + 0.16 * title_lines
    w_in, h_in = W * scale / dpi, H * scale / dpi
    fig = visualization.figure(w_in, h_in + title_h + extra_bottom, dpi)
    fig.set_layout_engine('none')
    total_h = h_in + title_h + extra_bottom
    ax = fig.add_axes([0, extra_bottom / total_h, 1, h_in / total_h])
    ax.imshow(image, interpolation='nearest' if scale > 1 else 'antialiased')
    ax.set_axis_off()
    return fig, ax, scale


def _overlaps(a, b):
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def place_labels(ax, scale, boxes, texts, colors, fontsize=8):
    """One label per box, in image coordinates (y down): above the box, else inside its
    top, below it, inside its bottom, the first spot that is clear of the labels already
    placed; always shifted to lie wholly inside the image. Returns the label rectangles
    (x0, y0, x1, y1) in image pixels."""
    renderer = ax.figure.canvas.get_renderer()
    H, W = ax.images[0].get_array().shape[:2]
    placed = []
    for (x0, y0, x1, y1), text, color in zip(boxes, texts, colors):
        t = ax.text(0, 0, text, fontsize=fontsize, color='white', va='top', ha='left',
                    bbox=dict(facecolor=color, alpha=0.85, pad=1.5, edgecolor='none'))
        ext = t.get_window_extent(renderer)  # the text; its box adds the pad around it
        pad = 1.5 * ax.figure.dpi / 72 / scale
        w, h = ext.width / scale + 2 * pad, ext.height / scale + 2 * pad
        candidates = [(x0, y0 - h), (x0, y0), (x0, y1), (x0, y1 - h)]
        spots = []
        for cx, cy in candidates:
            cx = min(max(cx, 0.), max(W - w, 0.))
            cy = min(max(cy, 0.), max(H - h, 0.))
            spots.append((cx, cy, cx + w, cy + h))
        spot = next((s for s in spots if not any(_overlaps(s, p) for p in placed)),
                    spots[0])
        t.set_position((spot[0] + pad, spot[1] + pad))
        placed.append(spot)
    return placed


def draw_detections(image, pred, classes, palette, title, score_thr):
    """Boxes (and masks) with 'class score' labels; returns (fig, kept detections)."""
    import matplotlib
    inst = pred.pred_instances
    keep = (inst.scores >= score_thr).nonzero().flatten().tolist()
    fig, ax, scale = _canvas(image, title.count('\n') + 1)
    fig.suptitle(title, fontsize=8, y=1 - 0.05 / fig.get_figheight())
    boxes, texts, colors, kept = [], [], [], []
    for i in keep:
        label = int(inst.labels[i])
        name = classes[label] if label < len(classes) else str(label)
        color = np.array(palette[label % len(palette)]) / 255 if palette else 'C0'
        x0, y0, x1, y1 = inst.bboxes[i].tolist()
        if 'masks' in inst:
            mask = inst.masks[i].cpu().numpy().astype(float)
            rgba = np.zeros(mask.shape + (4, ))
            rgba[..., :3] = matplotlib.colors.to_rgb(color)
            rgba[..., 3] = 0.45 * mask
            ax.imshow(rgba)
        ax.add_patch(matplotlib.patches.Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False,
                                                  edgecolor=color, linewidth=1.5))
        boxes.append((x0, y0, x1, y1))
        texts.append(f'{name} {float(inst.scores[i]):.2f}')
        colors.append(color)
        kept.append(dict(label=label, class_name=name, score=round(float(inst.scores[i]), 4),
                         bbox=[round(v, 2) for v in (x0, y0, x1, y1)]))
    place_labels(ax, scale, boxes, texts, colors)
    return fig, kept


def draw_segmentation(image, pred, classes, palette, title):
    """Class colours over the image and a legend of the classes present, below it."""
    import matplotlib
    seg = pred.pred_sem_seg.data[0].cpu().numpy()
    present = [int(c) for c in np.unique(seg)]
    rows = (len(present) + 2) // 3
    fig, ax, _ = _canvas(image, title.count('\n') + 1, extra_bottom=0.1 + 0.22 * rows)
    fig.suptitle(title, fontsize=8, y=1 - 0.05 / fig.get_figheight())
    colors = np.array(palette, dtype=float)[seg % len(palette)] / 255
    ax.imshow(np.concatenate([colors, np.full(seg.shape + (1, ), 0.5)], -1))
    handles = [matplotlib.patches.Patch(color=np.array(palette[c % len(palette)]) / 255,
                                        label=classes[c] if c < len(classes) else str(c))
               for c in present]
    fig.legend(handles=handles, loc='lower center', ncol=min(3, len(handles)), fontsize=8,
               frameon=False)
    return fig, seg


def build_parser():
    """The argument parser of this tool."""
    parser = cli.tool_parser(__doc__)
    parser.add_argument('image', nargs='*',
                        help='image files, folders or scikit-image sample names '
                        '(default: the config\'s test images)')
    cli.add_model_args(parser, backbone=None)
    parser.add_argument('--num-images', type=int, default=4,
                        help='how many test images without IMAGE (default 4)')
    parser.add_argument('--out-dir', default=osp.join('work_dirs', 'demo'))
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--score-thr', type=float, default=0.3,
                        help='detections below this score are not drawn')
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.config is None:
        configs = [i for i in args.image if i.endswith('.py')]
        if configs:  # the positional form of earlier versions: IMAGE CONFIG CHECKPOINT
            parser.error(f'give the config as --config {configs[0]} and the weights as '
                         '--checkpoint FILE_OR_WORK_DIR')
        parser.error('the following arguments are required: --config')
    cli.setup_logging()

    import mmsoft  # noqa: F401  (registers the backbones before the model is built)
    from mmengine.config import Config
    cfg = Config.fromfile(args.config)
    scope = cfg.get('default_scope', 'mmdet')
    if scope not in ('mmdet', 'mmseg'):
        raise ValueError(f'demo supports mmdet and mmseg configs, not {scope!r}')
    sources = args.image or inference.dataset_images(cfg, args.num_images)
    if not sources:
        parser.error(f"{args.config}'s test images are not there (for the mini configs: "
                     'python tools/misc/make_mini_dataset.py); give IMAGE (file, folder, '
                     'sample)')
    images = collect_images(sources)
    checkpoint = inference.resolve_checkpoint(args.checkpoint)
    name = osp.splitext(osp.basename(args.config))[0]
    weights = (osp.basename(checkpoint) if checkpoint else
               cli.warn_random_weights(name))

    if scope == 'mmdet':
        from mmdet.apis import inference_detector as infer
        from mmdet.apis import init_detector as init
    else:
        from mmseg.apis import inference_model as infer
        from mmseg.apis import init_model as init
    # record=True: mmdet's own simplefilter('once') cannot print 'checkpoint is None, use
    # COCO classes by default' (the config's classes replace them below)
    with warnings.catch_warnings(record=True):
        model = init(cfg, checkpoint, device=args.device)
    if checkpoint is None:
        model.init_weights()  # the network as training starts, not PyTorch's defaults
    meta = dict(getattr(model, 'dataset_meta', None) or {})
    if checkpoint is None:  # no checkpoint meta: the config's classes, not COCO's
        meta.update(cfg.get('test_dataloader', {}).get('dataset', {}).get('metainfo', {}))
    classes = list(meta.get('classes', ()))
    palette = [tuple(p) for p in meta.get('palette', ())] or None
    cli.logger.info(f'{name} knows {len(classes)} classes: ' + ', '.join(classes[:20]) +
                        (', ...' if len(classes) > 20 else ''))
    if palette is None:
        palette = [tuple(int(255 * v) for v in c[:3])
                   for c in __import__('matplotlib').colormaps['tab10'].colors]

    vis_dir, pred_dir = osp.join(args.out_dir, 'vis'), osp.join(args.out_dir, 'preds')
    os.makedirs(vis_dir, exist_ok=True)
    os.makedirs(pred_dir, exist_ok=True)
    results, figures = {}, {}
    for stem, source in images:
        cli.logger.info(f'image {inference.describe(source)}')
        image = inference.load_image(source)
        pred = infer(model, np.ascontiguousarray(image[..., ::-1]))  # BGR, as mmcv reads
        title = f'{name} · {weights}'
        if len(classes) <= 8:  # say what the model can find (the mini models: shapes)
            title += f' · classes: {", ".join(classes)}'
        title += f'\nimage {osp.basename(str(source))}'
        if osp.basename(str(source)) in inference.SAMPLES:
            title += f' ({inference.SAMPLES[source]})'
        if scope == 'mmdet':
            fig, dets = draw_detections(image, pred, classes, palette,
                                        f'{title} · score ≥ {args.score_thr}',
                                        args.score_thr)
            with open(osp.join(pred_dir, stem + '.json'), 'w') as f:
                json.dump(dict(image=str(source), detections=dets), f, indent=1)
            results[stem] = dets
        else:
            fig, seg = draw_segmentation(image, pred, classes, palette, title)
            from PIL import Image
            Image.fromarray(seg.astype(np.uint8)).save(osp.join(pred_dir, stem + '.png'))
            results[stem] = seg
        fig.savefig(osp.join(vis_dir, stem + '.png'), bbox_inches='tight', pad_inches=0.05)
        figures[stem] = fig
    print(f'wrote {len(images)} pictures to {vis_dir} and predictions to {pred_dir}')
    return dict(predictions=results, figures=figures)


if __name__ == '__main__':
    main()
