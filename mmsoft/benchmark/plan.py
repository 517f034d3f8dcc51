"""The measurements behind SOFT's per-device plan (``AttentionPlan`` in
mmsoft/models/attention/plan.py), one section per field:

  pinv    the batched 20-step pseudo-inverse alone, by landmark count m, by method (the
          formed iterate, A⁺·Z as inference computes it, eigh, on CUDA the TF32
          schedules), also on A zero-padded to aligned sizes: decides ``pinv``
  dwconv  the depthwise conv on V of SOFT-S's stages 1-3 in both layouts of
          ``HeadSharedConv``: decides ``local_conv_layout``
  kernel  the kernel products κ(Q, Q̃)ᵀ·V and κ(Q, Q̃)·W of SOFT-S's stages 1-3, P
          formed once vs in row chunks, with and without backward: decides
          ``kernel_chunk`` and ``kernel_once_up_to``
"""
import math
from functools import partial

import numpy as np
import torch

from mmsoft.models.attention import attention_plan

from .common import build, fmt, parse_size, time_call


# ------------------------------------------------------------------------------- pinv
def _zero_padded(fn, multiple, formed):
    """fn(A, Z) run on A padded with zero rows and columns (and Z with zero rows) to a
    multiple of ``multiple`` landmarks, the result cut back: the same iterate (A's block
    does not mix with the zero block; α is unchanged), with aligned matrix sizes.
    ``formed``: fn returns the (m, m) iterate, else the (m, n) product with Z."""
    import torch.nn.functional as F

    def run(A, Z):
        m = A.shape[-1]
        pad = -m % multiple
        if not pad:
            return fn(A, Z)
        out = fn(F.pad(A, (0, pad, 0, pad)), F.pad(Z, (0, 0, 0, pad)))
        return out[..., :m, :m] if formed else out[..., :m, :]

    return run


def _pinv_applied(A, Z, method):
    """A⁺·Z as inference computes it (a column of the pinv section)."""
    from mmsoft.models.attention import newton_pinv_apply
    return newton_pinv_apply(A, Z, method=method, nonnegative=True)


def section_pinv(args, out):
    """Batched 20-step pseudo-inverse of Gaussian-kernel matrices, by method."""
    from mmsoft.models.attention import gaussian_kernel, newton_pinv
    cols = {
        'iterative': lambda A, Z: newton_pinv(A, method='iterative', nonnegative=True),
        'iterative, applied': partial(_pinv_applied, method='iterative'),
        'spectral (eigh)': partial(_pinv_applied, method='spectral'),
    }
    if args.device == 'cuda':  # elsewhere TF32 is only emulated
        for method in ('tf32', 'tf32x3'):
            cols[f'{method}, applied'] = partial(_pinv_applied, method=method)
    k = args.pinv_pad
    if k > 1:  # the iterations again on sizes padded to a multiple of k
        for name in [c for c in cols if c != 'spectral (eigh)']:
            cols[f'{name}, m padded to ×{k}'] = _zero_padded(cols[name], k,
                                                             formed=name == 'iterative')
    lines = ['| m | batch | ' + ' | '.join(cols) + ' |', '|---|---|' + '---|' * len(cols)]
    rows = {}
    for m in args.pinv_sizes:
        x = torch.randn(20, m, 32, device=args.device) * 0.3
        A = gaussian_kernel(x, x)
        Z = torch.randn(20, m, 32, device=args.device)
        t = {}
        with torch.no_grad():
            for name, fn in cols.items():
                t[name] = time_call(args, lambda: fn(A, Z))
        rows[m] = t
        lines.append(f'| {m} | 20 | ' + ' | '.join(f'{v * 1e3:.1f} ms' for v in t.values())
                     + ' |')
    out['pinv'] = rows
    lines.append("\n'iterative' forms the iterate (2T products, what training keeps for "
                 "backward); 'applied' is A⁺·Z for a thin 32-column Z as inference "
                 'computes it (the formed iterate times Z); spectral: eigh (in float64) '
                 'and A⁺·Z.')
    if k > 1:
        lines.append(f"'padded': A with zero rows and columns up to a multiple of {k} "
                     '(the same iterate on its block; aligned sizes for the matrix '
                     'products), the result cut back.')
    return lines


# ----------------------------------------------------------------- SOFT-S's stages 1-3
def _soft_stages(soft, size):
    """(stage, heads h, head dim d, (H, W) token grid) of SOFT-S's stages 1-3 (strides 4,
    8, 16) at an input size 'HxW'."""
    H, W = parse_size(size)
    for s in range(3):
        stride = 4 * 2**s
        yield (s, soft.num_heads[s], soft.embed_dims[s] // soft.num_heads[s],
               (-(-H // stride), -(-W // stride)))


def _head_tokens(args, batch, hw, h, d):
    """Random Q or V as a SOFT block makes them: the (B, N, h·d) projection viewed as
    (B, h, N, d)."""
    return torch.randn(batch, hw[0] * hw[1], h, d, device=args.device).transpose(1, 2)


# ----------------------------------------------------------------------------- dwconv
def _dwconv_step(conv, v, hw, layout, train):
    if not train:
        with torch.no_grad():
            return conv(v, hw, layout)
    conv(v, hw, layout).sum().backward()
    conv.zero_grad(set_to_none=True)
    v.grad = None


def section_dwconv(args, out):
    """SOFT-S's depthwise conv on V, stages 1-3, in both layouts of ``HeadSharedConv``."""
    from mmsoft.models.backbones.soft import HeadSharedConv
    layouts = ('images', 'channels')
    lines = ['| size | stage | step | ' + ' | '.join(layouts) + ' | images / channels |',
             '|---|---|---|---|---|---|']
    rows = {}
    soft = build('SOFT-S')
    for size in args.sizes:
        for s, h, d, hw in _soft_stages(soft, size):
            conv = HeadSharedConv(h, d, soft.dwconv_sizes[s]).to(args.device)
            for step, batch in (('forward', 1), ('train', args.train_batch)):
                v = _head_tokens(args, batch, hw, h, d).requires_grad_(step == 'train')
                t = {}
                for layout in layouts:
                    t[layout] = time_call(args, lambda: _dwconv_step(conv, v, hw, layout,
                                                                      step == 'train'))
                rows[f'{size} stage{s + 1} {step}'] = t
                lines.append(f'| {size} | {s + 1} | {step} (batch {batch}) | '
                             + ' | '.join(fmt(t[k]) for k in layouts)
                             + f' | {t["images"] / t["channels"]:.2f} |')
    out['dwconv'] = rows
    lines.append(f"\nThe plan's local_conv_layout on {args.device}: the faster column (both "
                 'compute the same sums).')
    return lines


# ----------------------------------------------------------------------------- kernel
KERNEL_CHUNKS = (18, 20, 22, 24)  # log2 of the chunk sizes the kernel section tries


def _kernel_once(q, lm, v, w):
    from mmsoft.models.attention import gaussian_kernel
    with torch.no_grad():
        P = gaussian_kernel(q, lm)
        P.transpose(-1, -2) @ v
        return P @ w


def _kernel_chunked(device, chunk, train, q, lm, v, w):
    """κᵀ·V and κ·W in row chunks of ``chunk`` elements (the plan's ``kernel_chunk``
    forced for this device type), with backward if ``train``."""
    from mmsoft.models.attention import kernel_matmul
    with attention_plan(kernel_chunk=chunk, kernel_once_up_to=None,
                        device=torch.device(device).type), torch.set_grad_enabled(train):
        z = kernel_matmul(q, lm, v, transpose=True)
        out = kernel_matmul(q, lm, w)
        if train:
            (z.sum() + out.sum()).backward()
            for t in (q, lm, v, w):
                t.grad = None


def section_kernel(args, out):
    """SOFT-S's kernel products per stage: P once vs chunked, and chunk sizes in training."""
    soft = build('SOFT-S')
    cases = {}  # row name -> {variant: fn}
    for size in args.sizes:
        for s, h, d, hw in _soft_stages(soft, size):
            r = soft.sr_ratios[s]
            N, m = hw[0] * hw[1], (hw[0] // r) * (hw[1] // r)
            for step, B in (('inference', 1), ('train', args.train_batch)):
                train = step == 'train'
                q, v = (_head_tokens(args, B, hw, h, d) * 0.3 for _ in range(2))
                lm, w = (torch.randn(B, h, m, d, device=args.device) * 0.3 for _ in range(2))
                tensors = [t.requires_grad_(train) for t in (q, lm, v, w)]
                fns = {} if train else {'once': partial(_kernel_once, *tensors)}
                for c in KERNEL_CHUNKS:
                    fns[f'2^{c}'] = partial(_kernel_chunked, args.device, 2**c, train,
                                            *tensors)
                elements = math.log2(B * h * N * m)
                cases[f'{size} stage{s + 1} {step} (batch {B}, N={N}, m={m}: P has '
                      f'2^{elements:.1f} elements)'] = fns
    times = {name: {k: [] for k in fns} for name, fns in cases.items()}
    for r in range(args.rounds):
        for name, fns in cases.items():
            for k, fn in fns.items():
                times[name][k].append(time_call(args, fn, runs=1, warmup=r == 0))
    cols = ['once'] + [f'2^{c}' for c in KERNEL_CHUNKS]
    lines = ['| case | ' + ' | '.join(cols) + ' |', '|---|' + '---|' * len(cols)]
    rows = {}
    for name, t in times.items():
        rows[name] = {k: float(np.median(v)) for k, v in t.items()}
        lines.append(f'| {name} | ' + ' | '.join(
            fmt(rows[name][k]) if k in rows[name] else '–' for k in cols) + ' |')
    out['kernel'] = rows
    lines.append(f'\nMedian of {args.rounds} round(s), all variants in turn. inference: κᵀ·V '
                 'and κ·W with P formed once, or in row chunks of 2^k elements (P made '
                 "twice); train: the same with backward (P recomputed chunk by chunk). The "
                 f"plan's kernel_chunk on {args.device}: the fastest chunk; its "
                 'kernel_once_up_to: up to which size of P once wins.')
    return lines
