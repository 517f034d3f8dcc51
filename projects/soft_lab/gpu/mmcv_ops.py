"""The compiled mmcv ops that RetinaNet and Mask R-CNN call, from torchvision or plain
PyTorch: how the lab's GPU call runs detectors on a machine whose mmcv has no compiled ops
(mmcv-lite; building mmcv's CUDA ops there takes minutes of the call).

mmcv reaches its compiled ops through one module, ``mmcv._ext`` (``ext_loader.load_ext``).
Run as a script, this file puts itself in that module's place before anything imports
mmcv, then runs the script it is given, with its arguments:

    python projects/soft_lab/gpu/mmcv_ops.py [--tally FILE] SCRIPT [ARGS ...]

It serves the ops a detector's training iteration and test forward call:

  nms                          greedy non-maximum suppression (mmcv's ``nms``,
                               ``batched_nms``; RPN proposals, test-time boxes):
                               torchvision's ``nms`` (offset 0), else ``nms_pytorch``
  roi_align_forward/backward   RoIAlign, average pooling (mmdet's RoI extractors, mask
                               targets): torchvision's ``roi_align`` and its backward,
                               else ``roi_align_pytorch`` and ``roi_align_backward_pytorch``
  sigmoid_focal_loss_forward/  the focal loss of Lin et al. 2017 (eq. 5) per logit, and
  sigmoid_focal_loss_backward  its derivative, in PyTorch (mmdet calls mmcv's op on CUDA,
                               its own PyTorch version elsewhere)

Any other op raises when called, naming it. torchvision is used where it imports and runs
on the tensors' device (a build for another CUDA fails its first call; the op then falls
back to PyTorch and says so). None of these ops is in the backbone. ``--tally FILE``
writes, and the script prints at exit, per op: the route taken, calls and seconds (on
CUDA from events around each call, read at exit), so the report says how much of a step
they took.
"""
import atexit
import json
import os.path as osp
import runpy
import sys
import time

import torch
import torch.nn.functional as F

# ------------------------------------------------------------------ PyTorch routes


def nms_pytorch(boxes, scores, iou_threshold, offset=0):
    """Greedy NMS: indices of the kept boxes, highest score first. boxes (n, 4) as x1, y1,
    x2, y2; scores (n, ). A box is dropped when its IoU with a kept box of higher score
    exceeds ``iou_threshold``; ``offset`` (0 or 1) is added to widths and heights.

    Greedy suppression is the one ``keep`` with keep[i] = no j < i (by score) has keep[j]
    and IoU(i, j) > threshold: keep[i] depends on keep[:i] only, so iterating that map
    from all True fixes one more leading entry per round and stops at it, exactly, after
    as many rounds as the longest chain of suppressions (a few), each one (n, n) product
    on the device instead of n sequential steps."""
    if boxes.numel() == 0:
        return boxes.new_zeros(0, dtype=torch.long)
    order = scores.argsort(descending=True)
    x1, y1, x2, y2 = boxes[order].unbind(1)
    area = (x2 - x1 + offset) * (y2 - y1 + offset)
    w = (torch.minimum(x2[:, None], x2) - torch.maximum(x1[:, None], x1) + offset).clamp(min=0)
    h = (torch.minimum(y2[:, None], y2) - torch.maximum(y1[:, None], y1) + offset).clamp(min=0)
    inter = w * h
    # over[i, j]: box i (higher score) would suppress box j
    over = (inter / (area[:, None] + area - inter) > iou_threshold).triu(1)
    keep = torch.ones(len(order), dtype=torch.bool, device=boxes.device)
    while True:
        new = ~(over & keep[:, None]).any(0)
        if torch.equal(new, keep):
            return order[keep]
        keep = new


def _axis_weights(start, extent, bins, grid, length):
    """RoIAlign's bilinear weights along one axis, averaged over each bin's samples:
    (K, bins, length). start, extent (K, ): the RoI's start and size in feature pixels;
    grid (K, ): samples per bin. A sample outside [-1, length] weighs 0; one in it is
    clamped to [0, length - 1] and split between its two neighbours (He et al. 2017,
    Mask R-CNN, section 3: bilinear interpolation at regularly sampled points). The 2-D
    weights are the product of the two axes', so a bin's average is Wy · X · Wxᵀ."""
    K = start.shape[0]
    g = int(grid.max()) if K else 0
    step = extent / bins
    pos = (start[:, None, None] + torch.arange(bins, device=start.device)[:, None] *
           step[:, None, None] + (torch.arange(max(g, 1), device=start.device) + 0.5) *
           (step / grid.clamp(min=1))[:, None, None])  # (K, bins, g)
    valid = (torch.arange(max(g, 1), device=start.device) < grid[:, None])[:, None, :]
    inside = valid & (pos >= -1) & (pos <= length)
    pos = pos.clamp(min=0)
    low = pos.floor().long()
    last = low >= length - 1
    low = low.clamp(max=length - 1)
    high = torch.where(last, low, low + 1)
    frac = torch.where(last, torch.zeros_like(pos), pos - low)
    weights = pos.new_zeros(K, bins, length)
    weights.scatter_add_(2, low, (1 - frac) * inside)
    weights.scatter_add_(2, high, frac * inside)
    return weights / grid.clamp(min=1)[:, None, None].to(pos.dtype)


def _roi_weights(rois, shape, pooled, spatial_scale, sampling_ratio, aligned):
    """(Wy (K, ph, H), Wx (K, pw, W)) of RoIAlign for rois (K, 5) = (image, x1, y1, x2, y2)
    on a feature map of ``shape`` (H, W): mmcv's and torchvision's conventions (aligned:
    pixel centres at +0.5, extents not clamped; else extents at least 1; sampling_ratio 0:
    ceil(bin size) samples per bin)."""
    (H, W), (ph, pw) = shape, pooled
    shift = 0.5 if aligned else 0.0
    rois = rois.to(torch.float32 if rois.dtype in (torch.float16, torch.bfloat16)
                   else rois.dtype)
    x1, y1, x2, y2 = (rois[:, 1:] * spatial_scale - shift).unbind(1)
    w, h = x2 - x1, y2 - y1
    if not aligned:
        w, h = w.clamp(min=1), h.clamp(min=1)
    if sampling_ratio > 0:
        gy = gx = torch.full_like(w, sampling_ratio, dtype=torch.long)
    else:
        gy, gx = torch.ceil(h / ph).long(), torch.ceil(w / pw).long()
    return (_axis_weights(y1, h, ph, gy, H), _axis_weights(x1, w, pw, gx, W))


# rois per chunk: bounds the (chunk, C, H, pw) intermediate of the products below
ROI_CHUNK = 64


def roi_align_pytorch(x, rois, pooled, spatial_scale, sampling_ratio, aligned):
    """RoIAlign with average pooling: (K, C, ph, pw) from x (N, C, H, W) and rois (K, 5).
    Each output is Wy · x[image] · Wxᵀ (``_roi_weights``), computed per image and chunk
    of rois as two products."""
    N, C, H, W = x.shape
    Wy, Wx = (w.to(x.dtype) for w in _roi_weights(rois, (H, W), pooled, spatial_scale,
                                                   sampling_ratio, aligned))
    out = x.new_zeros(rois.shape[0], C, *pooled)
    image = rois[:, 0].long()
    for b in image.unique().tolist():
        for idx in (image == b).nonzero()[:, 0].split(ROI_CHUNK):
            t = x[b].reshape(1, C * H, W) @ Wx[idx].transpose(1, 2)  # (k, C·H, pw)
            out[idx] = Wy[idx, None] @ t.reshape(len(idx), C, H, -1)
    return out


def roi_align_backward_pytorch(grad, rois, shape, spatial_scale, sampling_ratio, aligned):
    """The gradient of ``roi_align_pytorch`` for x of ``shape`` (N, C, H, W) given the
    outputs' gradient (K, C, ph, pw): Σ over an image's rois of Wyᵀ · grad · Wx (RoIAlign
    is linear in x)."""
    N, C, H, W = shape
    Wy, Wx = (w.to(grad.dtype) for w in _roi_weights(rois, (H, W), grad.shape[2:],
                                                      spatial_scale, sampling_ratio, aligned))
    out = grad.new_zeros(shape)
    image = rois[:, 0].long()
    for b in image.unique().tolist():
        for idx in (image == b).nonzero()[:, 0].split(ROI_CHUNK):
            t = Wy[idx, None].transpose(2, 3) @ grad[idx]  # (k, C, H, pw)
            out[b] += torch.einsum('kchq,kqw->chw', t, Wx[idx])
    return out


def focal_loss_terms(x, target, gamma, alpha):
    """Per logit (n, C) with target classes (n, ) in [0, C] (C: background), the sigmoid
    focal loss FL = -α_t (1 - p_t)^γ log p_t (Lin et al. 2017, eq. 5) and its derivative
    in the logit: (loss, dloss/dx), each (n, C)."""
    p = torch.sigmoid(x)
    positive = target[:, None] == torch.arange(x.shape[1], device=x.device)
    log_p, log_q = F.logsigmoid(x), F.logsigmoid(-x)  # log p, log(1 - p)
    q = 1 - p
    loss = torch.where(positive, -alpha * q.pow(gamma) * log_p,
                       -(1 - alpha) * p.pow(gamma) * log_q)
    # d/dx of each: p' = p q
    dpos = -alpha * q.pow(gamma) * (q - gamma * p * log_p)
    dneg = -(1 - alpha) * p.pow(gamma) * (gamma * q * log_q - p)
    return loss, torch.where(positive, dpos, dneg)


# ---------------------------------------------------------------- torchvision routes
_TORCHVISION = {}  # device type -> torchvision.ops module, or the reason it is not used


def _torchvision(device):
    """torchvision.ops where it imports and runs on ``device``, else None (the reason
    kept for the tally)."""
    if device.type not in _TORCHVISION:
        try:
            import torchvision
            torchvision.ops.nms(torch.zeros(1, 4, device=device), torch.ones(1, device=device),
                                0.5)
            _TORCHVISION[device.type] = torchvision
        except Exception as e:  # absent, or built for another torch / CUDA
            _TORCHVISION[device.type] = f'{type(e).__name__}: {str(e)[:120]}'
    tv = _TORCHVISION[device.type]
    return None if isinstance(tv, str) else tv


# ----------------------------------------------------------------------- the tally
TALLY = {}  # op -> dict(route, calls, seconds or CUDA event pairs)


class _timed:
    """Adds one call of ``op`` by ``route`` on ``device`` to the tally, timed by CUDA
    events on CUDA (read at exit, no synchronization here), by the clock elsewhere."""

    def __init__(self, op, route, device):
        self.entry = TALLY.setdefault(op, dict(routes=set(), calls=0, seconds=0.0,
                                               events=[]))
        self.entry['routes'].add(route)
        self.cuda = device.type == 'cuda'

    def __enter__(self):
        self.entry['calls'] += 1
        if self.cuda:
            self.start = torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.entry['events'].append((self.start, end))
        else:
            self.entry['seconds'] += time.perf_counter() - self.t0


def tally():
    """{op: {'routes': [...], 'calls': n, 'seconds': s}} of the calls so far."""
    if any(e['events'] for e in TALLY.values()):
        torch.cuda.synchronize()
    return {op: dict(routes=sorted(e['routes']), calls=e['calls'],
                     seconds=e['seconds'] + sum(a.elapsed_time(b) for a, b in e['events'])
                     / 1e3) for op, e in TALLY.items()}


def _route(device, torchvision_ok=True):
    if torchvision_ok and _torchvision(device) is not None:
        return 'torchvision ' + _TORCHVISION[device.type].__version__
    return 'pytorch'


# -------------------------------------------------------------- mmcv._ext's functions
def nms(boxes, scores, iou_threshold, offset=0):
    route = _route(boxes.device, torchvision_ok=offset == 0)
    with _timed('nms', route, boxes.device):
        if route == 'pytorch':
            return nms_pytorch(boxes, scores, iou_threshold, offset)
        return _torchvision(boxes.device).ops.nms(boxes, scores, iou_threshold)


def _check_avg(pool_mode):
    if pool_mode != 1:
        raise NotImplementedError("roi_align with pool_mode 'max' is not served here "
                                  "(mmdet's RoI extractors use 'avg')")


def roi_align_forward(input, rois, output, argmax_y, argmax_x, aligned_height, aligned_width,
                      spatial_scale, sampling_ratio, pool_mode, aligned):
    _check_avg(pool_mode)
    route = _route(input.device)
    pooled = (aligned_height, aligned_width)
    with _timed('roi_align forward', route, input.device):
        if route == 'pytorch':
            res = roi_align_pytorch(input, rois, pooled, spatial_scale, sampling_ratio,
                                    aligned)
        else:
            res = _torchvision(input.device).ops.roi_align(
                input, rois.to(input.dtype), pooled, spatial_scale, sampling_ratio, aligned)
        output.copy_(res)


def roi_align_backward(grad_output, rois, argmax_y, argmax_x, grad_input, aligned_height,
                       aligned_width, spatial_scale, sampling_ratio, pool_mode, aligned):
    _check_avg(pool_mode)
    device = grad_output.device
    # torchvision's backward kernel (the op its autograd calls), where torchvision runs
    backward = (getattr(torch.ops.torchvision, '_roi_align_backward', None)
                if _torchvision(device) is not None else None)
    route = _route(device, torchvision_ok=backward is not None)
    with _timed('roi_align backward', route, device):
        if route == 'pytorch':
            res = roi_align_backward_pytorch(grad_output, rois, tuple(grad_input.shape),
                                             spatial_scale, sampling_ratio, aligned)
        else:
            N, C, H, W = grad_input.shape
            res = backward(grad_output, rois.to(grad_output.dtype), spatial_scale,
                           aligned_height, aligned_width, N, C, H, W, sampling_ratio, aligned)
        grad_input.copy_(res)


def _check_weight(weight):
    if weight.numel():
        raise NotImplementedError('sigmoid_focal_loss with class weights is not served here '
                                  '(mmdet applies its weights after the op)')


def sigmoid_focal_loss_forward(input, target, weight, output, gamma, alpha):
    _check_weight(weight)
    with _timed('sigmoid_focal_loss forward', 'pytorch', input.device):
        output.copy_(focal_loss_terms(input, target, gamma, alpha)[0])


def sigmoid_focal_loss_backward(input, target, weight, grad_input, gamma, alpha):
    _check_weight(weight)
    with _timed('sigmoid_focal_loss backward', 'pytorch', input.device):
        grad_input.copy_(focal_loss_terms(input, target, gamma, alpha)[1])


SERVED = ('nms', 'roi_align_forward', 'roi_align_backward', 'sigmoid_focal_loss_forward',
          'sigmoid_focal_loss_backward')


def __getattr__(name):  # mmcv's load_ext asks for every op of a module at import
    if name.startswith('__'):
        raise AttributeError(name)

    def missing(*args, **kwargs):
        raise NotImplementedError(f'mmcv op {name!r} is not served by {__file__} (it serves '
                                  f'{", ".join(SERVED)})')
    return missing


# ------------------------------------------------------------------------ the runner
def tally_lines(counts, process_seconds=None):
    """What the runner prints at exit: a line per op, and their sum (with its share of
    the process's time where given)."""
    lines = ["mmcv's compiled ops served from torchvision / PyTorch "
             '(projects/soft_lab/gpu/mmcv_ops.py):']
    for op, e in counts.items():
        lines.append(f'  {op}: {", ".join(e["routes"])}; {e["calls"]} calls, '
                     f'{e["seconds"]:.3f} s')
    reasons = {d: r for d, r in _TORCHVISION.items() if isinstance(r, str)}
    for d, r in reasons.items():
        lines.append(f'  torchvision not used on {d}: {r}')
    total = sum(e['seconds'] for e in counts.values())
    share = (f' ({100 * total / process_seconds:.1f} % of the process\'s '
             f'{process_seconds:.1f} s)' if process_seconds else '')
    lines.append(f'  in all {total:.3f} s{share}')
    return lines


def install():
    """This file loaded as the module ``mmcv._ext`` (before mmcv.ops is imported): every
    mmcv op module loads it from then on and calls these functions. Returns the module
    (its ``tally()`` counts the calls)."""
    import importlib.util
    if 'mmcv.ops' in sys.modules:
        raise RuntimeError('mmcv.ops is imported already: install() must come first')
    spec = importlib.util.spec_from_file_location('mmcv._ext', osp.abspath(__file__))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules['mmcv._ext'] = module
    return module


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    out = None
    if argv[:1] == ['--tally']:
        out, argv = argv[1], argv[2:]
    if not argv:
        sys.exit(__doc__.split('\n\n')[2])
    ext = install()
    started = time.perf_counter()

    def report():
        counts, seconds = ext.tally(), time.perf_counter() - started
        print('\n'.join(ext.tally_lines(counts, seconds)), flush=True)
        if out:
            with open(out, 'w') as f:
                json.dump(dict(ops=counts, process_seconds=seconds,
                               torchvision={d: (r if isinstance(r, str) else r.__version__)
                                            for d, r in ext._TORCHVISION.items()}),
                          f, indent=1)
    atexit.register(report)
    sys.argv = argv
    sys.path[0] = osp.dirname(osp.abspath(argv[0]))  # as `python SCRIPT` would have it
    runpy.run_path(argv[0], run_name='__main__')


if __name__ == '__main__':
    main()
