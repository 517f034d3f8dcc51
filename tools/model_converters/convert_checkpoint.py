"""Convert an official SOFT, XCiT or SimA ImageNet checkpoint into an mmengine backbone
checkpoint: ``{'state_dict': {'backbone.<key>': tensor}, 'meta': {...}}``.

The result loads through ``init_cfg=dict(type='Pretrained', checkpoint=OUT)`` (the
``backbone.`` prefix is stripped) and through ``load_from`` of a detector or segmentor
(only the backbone is filled). The backbones also load the official files directly; the
converted file is smaller (no optimizer state, no EMA copy, no classifier) and loads with
torch's default ``weights_only=True`` without any allow-list.

Usage: python tools/model_converters/convert_checkpoint.py {soft,xcit_sima} SRC DST
"""
import argparse

import torch


def convert(family, src):
    import mmsoft  # noqa: F401  (allow-lists argparse.Namespace of timm checkpoints)
    from mmengine.runner.checkpoint import CheckpointLoader

    from mmsoft.checkpoint import extract_state_dict
    from mmsoft.models.backbones import soft, xcit_sima
    filter_fn = {'soft': soft.checkpoint_filter_fn,
                 'xcit_sima': xcit_sima.checkpoint_filter_fn}[family]
    state = filter_fn(extract_state_dict(CheckpointLoader.load_checkpoint(src, 'cpu')))
    return {'state_dict': {'backbone.' + k: v.clone() for k, v in state.items()},
            'meta': {'converted_from': str(src), 'family': family}}


def build_parser():
    """The argument parser of this tool."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('family', choices=['soft', 'xcit_sima'])
    parser.add_argument('src', help='official checkpoint (path or URL)')
    parser.add_argument('dst', help='output .pth')
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    ckpt = convert(args.family, args.src)
    torch.save(ckpt, args.dst)
    print(f'wrote {len(ckpt["state_dict"])} backbone tensors to {args.dst}')


if __name__ == '__main__':
    main()
