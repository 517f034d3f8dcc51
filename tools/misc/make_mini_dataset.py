"""Generate the mini datasets used by the configs under configs/_mini_/ (deterministic).

- ``DATA/mini_coco``: COCO-format detection + instance masks (polygons), two classes
  (``rectangle``, ``ellipse``) drawn on textured backgrounds;
  ``{train,val}/*.png`` and ``annotations/instances_{train,val}.json``.
- ``DATA/mini_ade``: the same images in ADE20K layout (``images/{training,validation}/*.jpg``,
  ``annotations/{training,validation}/*.png``) with ADE20K's label convention: 0 = unlabeled
  (ignored with ``reduce_zero_label``), 1 = background, 2 = rectangle, 3 = ellipse.

The objects are easy enough that a small model learns to find them within minutes of CPU
training, and hard enough (random colours, sizes, textures, up to 4 objects) that an
untrained model does not.

Usage: python tools/misc/make_mini_dataset.py [--out data] [--train 200] [--val 40] [--size 128]
"""
import argparse
import json
import os
import os.path as osp

import numpy as np
from PIL import Image, ImageDraw

CLASSES = ('rectangle', 'ellipse')


def _background(rng, size):
    """A smooth random colour gradient plus noise."""
    h = w = size
    c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    t = np.linspace(0, 1, w)[None, :, None]
    if rng.random() < 0.5:
        t = np.linspace(0, 1, h)[:, None, None]
    img = c0 * (1 - t) + c1 * t
    img = np.broadcast_to(img, (h, w, 3)) + rng.normal(0, 12, (h, w, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def _shape_polygon(kind, box, n=24):
    x0, y0, x1, y1 = box
    if kind == 'rectangle':
        return [x0, y0, x1, y0, x1, y1, x0, y1]
    cx, cy, rx, ry = (x0 + x1) / 2, (y0 + y1) / 2, (x1 - x0) / 2, (y1 - y0) / 2
    a = np.linspace(0, 2 * np.pi, n, endpoint=False)
    return np.stack([cx + rx * np.cos(a), cy + ry * np.sin(a)], 1).ravel().tolist()


def make_sample(rng, size):
    """One image with 1-4 non-overlapping objects; returns image, objects, label map."""
    img = Image.fromarray(_background(rng, size))
    draw = ImageDraw.Draw(img)
    label = Image.new('L', (size, size), 1)  # 1 = background (ADE convention)
    ldraw = ImageDraw.Draw(label)
    objects, boxes = [], []
    for _ in range(int(rng.integers(1, 5))):
        for _try in range(20):
            w, h = rng.integers(size // 6, size // 2.5, 2)
            x0, y0 = rng.integers(0, size - w), rng.integers(0, size - h)
            box = (int(x0), int(y0), int(x0 + w), int(y0 + h))
            if all(box[2] + 2 < b[0] or b[2] + 2 < box[0] or box[3] + 2 < b[1]
                   or b[3] + 2 < box[1] for b in boxes):
                break
        else:
            continue
        kind = CLASSES[int(rng.integers(0, 2))]
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        poly = _shape_polygon(kind, box)
        xy = list(zip(poly[0::2], poly[1::2]))
        draw.polygon(xy, fill=colour, outline=(0, 0, 0))
        ldraw.polygon(xy, fill=2 + CLASSES.index(kind))
        boxes.append(box)
        objects.append(dict(kind=kind, polygon=poly))
    return img, objects, label


def polygon_area(poly):
    x, y = np.asarray(poly[0::2]), np.asarray(poly[1::2])
    return float(0.5 * abs(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1))))


def write_split(rng, out, split, ade_split, count, size):
    coco_dir = osp.join(out, 'mini_coco')
    ade_dir = osp.join(out, 'mini_ade')
    for d in (osp.join(coco_dir, split), osp.join(coco_dir, 'annotations'),
              osp.join(ade_dir, 'images', ade_split),
              osp.join(ade_dir, 'annotations', ade_split)):
        os.makedirs(d, exist_ok=True)
    images, annotations = [], []
    for i in range(count):
        img, objects, label = make_sample(rng, size)
        name = f'{split}_{i:05d}'
        img.save(osp.join(coco_dir, split, name + '.png'))
        img.save(osp.join(ade_dir, 'images', ade_split, name + '.jpg'), quality=95)
        label.save(osp.join(ade_dir, 'annotations', ade_split, name + '.png'))
        images.append(dict(id=i, file_name=name + '.png', width=size, height=size))
        for obj in objects:
            xs, ys = obj['polygon'][0::2], obj['polygon'][1::2]
            x0, y0 = min(xs), min(ys)
            annotations.append(dict(
                id=len(annotations) + 1, image_id=i,
                category_id=CLASSES.index(obj['kind']) + 1,
                bbox=[x0, y0, max(xs) - x0, max(ys) - y0],
                area=polygon_area(obj['polygon']),
                segmentation=[obj['polygon']], iscrowd=0))
    categories = [dict(id=i + 1, name=c) for i, c in enumerate(CLASSES)]
    with open(osp.join(coco_dir, 'annotations', f'instances_{split}.json'), 'w') as f:
        json.dump(dict(images=images, annotations=annotations, categories=categories), f)
    return len(images), len(annotations)


def build_parser():
    """The argument parser of this tool."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--out', default='data', help='output root (default: data)')
    parser.add_argument('--train', type=int, default=200, help='training images')
    parser.add_argument('--val', type=int, default=40, help='validation images')
    parser.add_argument('--size', type=int, default=128, help='image side in pixels')
    parser.add_argument('--seed', type=int, default=0)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.size < 32:
        parser.error('--size must be at least 32')
    rng = np.random.default_rng(args.seed)
    for split, ade_split, n in (('train', 'training', args.train),
                                ('val', 'validation', args.val)):
        n_img, n_ann = write_split(rng, args.out, split, ade_split, n, args.size)
        print(f'{split}: {n_img} images, {n_ann} objects')
    print(f'wrote {osp.join(args.out, "mini_coco")} and {osp.join(args.out, "mini_ade")}')


if __name__ == '__main__':
    main()
