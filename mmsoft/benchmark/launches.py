"""Host work per step in eager mode: the ATen operators (on a GPU: kernel launches) of a
forward and of a training step of SOFT-S modes, XCiT-SimA and Swin-T at each ``--sizes``
entry, counted on PyTorch's data-less meta device with CUDA's plan
(``attention_plan(PLANS['cuda'], device='meta')``: the ``pinv``, ``kernel_chunk``,
``kernel_once_up_to`` and ``local_conv_layout`` a GPU runs), so no GPU is needed; and
the floating-point operations of their matrix products, the work a GPU's matrix units
do (``LaunchCounter.matmul_flops``).
"""
import torch

from mmsoft.models.attention import PLANS, attention_plan

from .common import build, parse_size

LAUNCH_MODELS = (('Swin-T', 'auto'), ('SOFT-S', 'auto'), ('SOFT-S', 'grid16'),
                 ('SOFT-S', 'regularized'), ('XCiT-SimA-S12/16', 'auto'))


def section_launches(args, out):
    """ATen operators per forward and training step, with CUDA's plan, on the meta device."""
    from mmsoft.testing import LaunchCounter
    lines = ['| model | size | forward (batch 1) | vs Swin-T | training step (batch '
             f'{args.train_batch}) | vs Swin-T |', '|---|---|---|---|---|---|']
    rows, work = {}, []
    with attention_plan(PLANS['cuda'], device='meta'):
        for size in args.sizes:
            H, W = parse_size(size)
            for name, mode in LAUNCH_MODELS:
                model = build(name, mode).to('meta')
                n = {}
                for step, batch in (('forward', 1), ('train', args.train_batch)):
                    model.train(step == 'train')
                    x = torch.zeros(batch, 3, H, W, device='meta')
                    with LaunchCounter() as count, torch.set_grad_enabled(step == 'train'):
                        outs = model(x)
                        if step == 'train':
                            sum(o.mean() for o in outs).backward()
                    n[step] = count.total
                    flops = count.matmul_flops
                    n.setdefault('matmul_gflop', {})[step] = sum(flops.values()) / 1e9
                    n.setdefault('square_matmul_gflop', {})[step] = flops['square'] / 1e9
                label = name if name != 'SOFT-S' else f'SOFT-S ({mode})'
                rows[f'{label} {size}'] = n
                work.append(f'| {label} | {size} | ' + ' | '.join(
                    f"{n['matmul_gflop'][step]:.4g} ({n['square_matmul_gflop'][step]:.4g})"
                    for step in ('forward', 'train')) + ' |')
                base = rows[f'Swin-T {size}']
                lines.append(f'| {label} | {size} | {n["forward"]} | '
                             f'{n["forward"] / base["forward"]:.2f} | {n["train"]} | '
                             f'{n["train"] / base["train"]:.2f} |')
    out['launches'] = rows
    lines.append('\nATen operators run below autograd (views and allocations not counted), '
                 "counted on PyTorch's data-less meta device with CUDA's plan (its pinv, "
                 'kernel_chunk, kernel_once_up_to and local_conv_layout): on a GPU each '
                 'launches one or more kernels, so in eager mode they are the host work per '
                 'step.')
    lines += ['', '| model | size | forward: matrix-product GFLOP (of products of square '
              f'matrices) | training step, batch {args.train_batch}: the same |',
              '|---|---|---|---|'] + work
    lines.append('\nThe floating-point operations of the matrix products (mm, bmm, addmm, '
                 "baddbmm, also in place: 2·M·K·N each) in the same steps; in parentheses "
                 "those of products of two square matrices of one size, SOFT's m×m iterate "
                 "among them (its TF32 and float32 products alike).")
    return lines
