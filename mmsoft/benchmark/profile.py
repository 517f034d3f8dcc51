"""Where SOFT-S's time goes: its forward (batch 1) and training step (``--train-batch``)
at each ``--sizes`` entry, under its default plan and each ``--soft-plans`` path, profiled
with ``torch.profiler``: the device's time by kernel (on a GPU the CUDA kernels, on a CPU
the ATen operators' own time), the largest first. What a plan's speed comes from, and
what the next change should take on.
"""
import torch


from .common import build, fmt, measure, parse_size, path_context, sync

PROFILE_TOP = 12  # kernels listed per step


def _step(model, x, train):
    if train:
        model.zero_grad(set_to_none=True)
        sum(o.mean() for o in model(x)).backward()
    else:
        with torch.no_grad():
            model(x)


def _device_time(event, cuda):
    """An event's own time on the device, in seconds (torch 2.1-2.14 spellings)."""
    if not cuda:
        return event.self_cpu_time_total / 1e6
    us = getattr(event, 'self_device_time_total', None)
    return (us if us is not None else event.self_cuda_time_total) / 1e6


def profile_step(model, size, device, train, batch):
    """(wall seconds of one step, {kernel: [seconds, launches]}) of ``model`` at ``size``:
    a step timed by ``measure`` after its warm-up (kernel compilation), then one profiled."""
    from torch.profiler import ProfilerActivity, profile
    cuda = torch.device(device).type == 'cuda'
    wall = measure(model, parse_size(size), device, repeat=1, train=train, batch=batch)
    x = torch.randn(batch, 3, *parse_size(size), device=device)
    kind = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        _step(model, x, train)
        sync(device)
    kernels = {}
    for e in prof.key_averages():
        if getattr(e, 'device_type', kind) == kind and e.count:
            kernels[e.key] = [_device_time(e, cuda), e.count]
    return wall, kernels


def section_profile(args, out):
    """SOFT-S's forward and training step by kernel, per plan (module docstring)."""
    what = 'GPU kernels' if args.device == 'cuda' else "ATen operators' own CPU time"
    lines, rows = [], {}
    for size in args.sizes:
        for path in ['default', *args.soft_plans]:
            for train in (False, True):
                batch = args.train_batch if train else 1
                step = f'training step, batch {batch}' if train else 'forward, batch 1'
                with path_context(path, args.device):
                    wall, kernels = profile_step(build('SOFT-S'), size, args.device, train,
                                                 batch)
                total = sum(t for t, _ in kernels.values())
                launches = sum(n for _, n in kernels.values())
                top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:PROFILE_TOP]
                rows[f'{size} {path} {"train" if train else "forward"}'] = dict(
                    wall=wall, device=total, launches=launches,
                    top=[[name, t, n] for name, (t, n) in top])
                lines += [f'\n##### SOFT-S {size} [{path}], {step}: wall {fmt(wall)}, '
                          f'{what} {fmt(total)} in {launches} calls',
                          '| time | calls | kernel |', '|---|---|---|']
                lines += [f'| {fmt(t)} | {n} | {name[:100]} |' for name, (t, n) in top]
    out['profile'] = rows
    lines.append('\nOne profiled step after a warm-up and a timed one (wall); the '
                 f'{PROFILE_TOP} largest by own time. [path]: the plan (default: the '
                 "device's; the others: --soft-plans, the paths of "
                 'tools/analysis_tools/fidelity.py).')
    return lines
