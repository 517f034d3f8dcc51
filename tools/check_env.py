"""Check that the environment made by tools/setup_env.sh works: versions, mmcv ops on CPU,
and that the OpenMMLab codebases and mmsoft import. Exits non-zero on the first problem."""
import os
import sys


def main():
    import torch
    import mmcv
    import mmengine
    from mmcv.ops import nms, roi_align

    boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 11., 11.], [50., 50., 60., 60.]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    _, keep = nms(boxes, scores, iou_threshold=0.5)
    assert keep.tolist() == [0, 2], f'mmcv nms gave {keep.tolist()}'
    feat = torch.arange(16.).view(1, 1, 4, 4)
    rois = torch.tensor([[0., 0., 0., 3., 3.]])
    out = roi_align(feat, rois, (2, 2), 1.0, 2, 'avg', True)
    assert out.shape == (1, 1, 2, 2) and torch.isfinite(out).all()

    import mmdet
    import mmseg
    import mmpretrain
    import mmsoft

    # `mim train/test mmsoft` look for <distribution location>/mmsoft/.mim/tools/
    from mim.utils import get_installed_path
    tools = os.path.join(get_installed_path('mmsoft'), '.mim', 'tools', 'train.py')
    assert os.path.isfile(tools), f'mim cannot find mmsoft tools at {tools}; reinstall mmsoft'
    print(f'torch {torch.__version__}, mmcv {mmcv.__version__} (ops ok), '
          f'mmengine {mmengine.__version__}, mmdet {mmdet.__version__}, '
          f'mmseg {mmseg.__version__}, mmpretrain {mmpretrain.__version__}, '
          f'mmsoft {mmsoft.__version__}')


if __name__ == '__main__':
    try:
        main()
    except Exception as e:  # noqa: BLE001 - report any failure in one line
        print(f'environment check failed: {type(e).__name__}: {e}', file=sys.stderr)
        sys.exit(1)
