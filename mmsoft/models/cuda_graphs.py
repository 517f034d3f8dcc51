"""CUDA graphs around a backbone's stages: SOFT's opt-in ``cuda_graphs``.

On a GPU, SOFT's eager forward is launch-bound: about 1200 operators per forward against
Swin-T's 463 (``tools/analysis_tools/benchmark.py --sections launches``), most of them the
40 small products of each layer's Newton–Raphson iterate. A CUDA graph records the
kernels of a call once and replays them all with one launch. ``StageGraphs`` does that
for the blocks of each stage, per input signature (``signature``):

- without gradients, one graph of the stage's forward (``InferenceGraph``);
- with gradients, a forward and a backward graph joined by an autograd function
  (``TrainingGraph``). Its backward returns copies of the gradients, never the graph's
  own buffers, so gradients accumulate over several backward passes as in eager mode
  (``torch.cuda.make_graphed_callables`` returns its static buffers, which the next
  replay overwrites).

A call copies its input into the graph's static input, replays, and returns a copy of
the static output, so results stay valid after the next call. The patch embeddings
(and their BatchNorm or SyncBN, which communicates) stay eager.

A signature is captured the ``min_calls``-th time it is seen, at most ``max_graphs``
per stage; every other call, and any call while torch.compile, tracing, ONNX export or
another CUDA-graph capture runs, is eager, with the same result. A graph replays what
was recorded: hooks on the stage's modules and host-side branches do not run again,
and the kernels chosen at capture (TF32 or not, the attention plan) are kept, which is
why those are part of the signature.
"""
import warnings
import weakref
from collections import Counter

import torch
from torch.autograd.function import once_differentiable

from .attention.dtypes import autocast_dtype, float32_precision, is_compiling

__all__ = ['InferenceGraph', 'StageGraphs', 'TrainingGraph', 'can_capture',
           'check_cuda_graphs', 'signature']

# ``cuda_graphs`` as a dict: these keys, these defaults.
DEFAULTS = dict(min_calls=2, max_graphs=4)


def check_cuda_graphs(value, family):
    """A backbone's ``cuda_graphs`` argument -> None (off) or the full settings dict.

    False / None: off; True: ``DEFAULTS``; a dict: ``DEFAULTS`` updated with it, each an
    int >= 1.
    """
    if value is None or value is False:
        return None
    if value is True:
        return dict(DEFAULTS)
    if not isinstance(value, dict):
        raise ValueError(f'{family}: cuda_graphs must be True, False or a dict with keys '
                         f'{sorted(DEFAULTS)}, got {value!r}')
    unknown = sorted(set(value) - set(DEFAULTS))
    if unknown:
        raise ValueError(f'{family}: cuda_graphs has unknown keys {unknown}; allowed: '
                         f'{sorted(DEFAULTS)}')
    settings = {**DEFAULTS, **value}
    for key, v in settings.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f'{family}: cuda_graphs {key} must be an int >= 1, got {v!r}')
    return settings


def can_capture(x):
    """Whether a call on ``x`` may be captured: a CUDA tensor, outside torch.compile,
    tracing, ONNX export and another capture."""
    return (x.is_cuda and not (is_compiling() or torch.jit.is_tracing()
                               or torch.onnx.is_in_onnx_export())
            and not torch.cuda.is_current_stream_capturing())


def signature(module, x, params, extra=()):
    """What a captured graph depends on besides the values of ``x`` and ``params``:
    ``x``'s shape, dtype, device and whether it needs a gradient, the module's mode,
    gradient and inference mode, autocast, which parameters train and where they and
    the module's buffers live (a graph reads their addresses: a replica of
    ``nn.DataParallel`` or reassigned ``.data`` gets graphs of its own), the float32
    precision of matmuls and convolutions (the kernels chosen at capture), and
    ``extra`` (the caller's: SOFT passes the token grid and the attention plan)."""
    return (tuple(x.shape), x.dtype, x.device, x.requires_grad, module.training,
            torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
            autocast_dtype(x.device.type), tuple(p.requires_grad for p in params),
            tuple(t.data_ptr() for t in params), tuple(b.data_ptr() for b in module.buffers()),
            float32_precision(), tuple(extra))


def _warm_up(step, iters):
    """Run ``step`` ``iters`` times on a side stream (lazy initialization, cuBLAS
    workspaces and autotuning then happen outside the capture); the stream to capture
    on."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(iters):
            step()
    torch.cuda.synchronize()
    return stream


def _capturing(graph, stream, pool=None):
    """``torch.cuda.graph`` on ``stream``; only this thread's unsafe calls invalidate
    the capture (a data loader's pin-memory thread may run CUDA calls meanwhile)."""
    return torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode='thread_local')


def _no_autocast_cache(device_type):
    """Autocast as in force, with its weight cache off for the capture (cached casts
    made outside a graph would be replayed stale); a no-op where autocast is off."""
    dtype = autocast_dtype(device_type)
    return torch.autocast(device_type, dtype=dtype, enabled=dtype is not None,
                          cache_enabled=False)


class InferenceGraph:
    """``fn(x)`` without gradients, replayed from one CUDA graph.

    Args:
        fn (callable): Tensor -> Tensor, the stage's eager forward.
        x (Tensor): a CUDA input of the signature to capture.
        warmup (int): eager calls on a side stream before the capture.
    """
    busy = False  # the output is a copy: a replay never spoils an earlier result

    def __init__(self, fn, x, warmup=3):
        self.static_x = x.detach().clone()
        with _no_autocast_cache(x.device.type):
            stream = _warm_up(lambda: fn(self.static_x), warmup)
            self.graph = torch.cuda.CUDAGraph()
            with _capturing(self.graph, stream):
                self.static_out = fn(self.static_x)

    def __call__(self, x):
        self.static_x.copy_(x)
        self.graph.replay()
        return self.static_out.clone()


class _Token:
    """Marks the one forward replay whose backward a ``TrainingGraph`` awaits."""


class TrainingGraph:
    """``fn(x)`` with gradients for ``x`` (if it needs one) and ``params``: a forward and
    a backward CUDA graph sharing one memory pool, joined by ``_ReplayStage``.

    The backward graph reads what the forward graph saved, so a second forward replay
    before the first one's backward would spoil it: the graph is ``busy`` from a forward
    replay until its backward ran or its autograd graph was freed, and ``StageGraphs``
    runs such calls eagerly.

    Args:
        fn (callable): Tensor -> Tensor, the stage's eager forward.
        x (Tensor): a CUDA input of the signature to capture.
        params (Sequence[Parameter]): every parameter ``fn`` uses.
        warmup (int): eager forward and backward passes on a side stream first.
    """

    def __init__(self, fn, x, params, warmup=3):
        self.params = tuple(params)
        self.static_x = x.detach().clone().requires_grad_(x.requires_grad)
        # what gradients are computed for: x (if it needs one), the trainable parameters
        self.wrt = [t for t in (self.static_x, ) + self.params if t.requires_grad]
        self._awaiting = None

        def step():
            out = fn(self.static_x)
            torch.autograd.grad(out, self.wrt, torch.zeros_like(out), allow_unused=True)

        with _no_autocast_cache(x.device.type):
            stream = _warm_up(step, warmup)
            pool = torch.cuda.graph_pool_handle()
            self.forward_graph = torch.cuda.CUDAGraph()
            with _capturing(self.forward_graph, stream, pool):
                self.static_out = fn(self.static_x)
            self.static_grad_out = torch.empty_like(self.static_out)
            self.backward_graph = torch.cuda.CUDAGraph()
            with _capturing(self.backward_graph, stream, pool):
                grads = torch.autograd.grad(self.static_out, self.wrt, self.static_grad_out,
                                            allow_unused=True)
        it = iter(grads)
        # per (x, *params): its static gradient buffer, or None (no gradient)
        self.static_grads = [next(it) if t.requires_grad else None
                             for t in (self.static_x, ) + self.params]

    @property
    def busy(self):
        return self._awaiting is not None and self._awaiting() is not None

    def __call__(self, x):
        return _ReplayStage.apply(self, x, *self.params)

    def forward_replay(self):
        """Replay the forward graph on ``static_x``; the token its backward must show."""
        self.forward_graph.replay()
        token = _Token()
        self._awaiting = weakref.ref(token)
        return token

    def backward_replay(self, token, grad_out):
        """Replay the backward graph for the forward replay of ``token``: copies of the
        gradients of (x, *params), None where there is none."""
        if self._awaiting is None or self._awaiting() is not token:
            raise RuntimeError('a CUDA-graphed stage was replayed again before the backward '
                               'of an earlier replay: its saved activations are gone')
        self.static_grad_out.copy_(grad_out)
        self.backward_graph.replay()
        self._awaiting = None
        return tuple(None if g is None else g.clone() for g in self.static_grads)


class _ReplayStage(torch.autograd.Function):
    """Autograd's view of a ``TrainingGraph`` call: x and the parameters in, a copy of
    the static output out; backward replays the backward graph."""

    @staticmethod
    def forward(ctx, graph, x, *params):
        graph.static_x.copy_(x)
        ctx.graph, ctx.token = graph, graph.forward_replay()
        return graph.static_out.clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        return (None, ) + ctx.graph.backward_replay(ctx.token, grad_out)


def capture(fn, x, params, warmup=3):
    """A ``TrainingGraph`` of ``fn`` where gradients are needed (gradient mode on, and
    ``x`` or a parameter needs one), else an ``InferenceGraph``."""
    if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in params)):
        return TrainingGraph(fn, x, params, warmup)
    return InferenceGraph(fn, x, warmup)


_FAILED = object()  # a signature whose capture failed: always eager


class StageGraphs:
    """The captured graphs of a backbone's stages, by stage and ``signature``.

    Args:
        min_calls (int): capture a signature the ``min_calls``-th time a stage sees it
            (1: at once; one-off sizes stay eager with the default 2).
        max_graphs (int): at most this many captured signatures per stage; calls of
            further signatures run eagerly (each graph keeps its activations' memory).
        warmup (int): eager calls before each capture.
        capture (callable): ``(fn, x, params, warmup) -> graph``, a callable object
            with a ``busy`` attribute (default: ``capture``, CUDA graphs).
    """

    def __init__(self, min_calls=DEFAULTS['min_calls'], max_graphs=DEFAULTS['max_graphs'],
                 warmup=3, capture=capture):
        self.min_calls, self.max_graphs, self.warmup = min_calls, max_graphs, warmup
        self.capture = capture
        self.clear()

    def clear(self):
        """Drop every graph (and its memory), e.g. when the parameters moved."""
        self._graphs = {}  # (stage, signature) -> graph or _FAILED
        self._seen = Counter()  # (stage, signature) -> calls so far

    def captured(self, stage=None):
        """How many graphs are held (for ``stage``, or all stages)."""
        return sum(g is not _FAILED and (stage is None or k[0] == stage)
                   for k, g in self._graphs.items())

    def run(self, stage, fn, x, modules, extra=()):
        """``fn(x)``, from a graph of ``stage`` where one is (or may now be) captured.

        Args:
            stage (hashable): which stage.
            fn (callable): Tensor -> Tensor, the stage's eager forward.
            x (Tensor): its input.
            modules (nn.Module): the modules ``fn`` runs (their parameters, mode and
                hooks).
            extra (tuple): what else the result depends on (``signature``).
        """
        params = tuple(modules.parameters())
        key = (stage, signature(modules, x, params, extra))
        graph = self._graphs.get(key)
        if graph is None:
            self._seen[key] += 1
            if (self._seen[key] < self.min_calls
                    or self.captured(stage) >= self.max_graphs):
                return fn(x)
            graph = self._graphs[key] = self._try_capture(stage, fn, x, modules, params)
        if graph is _FAILED or graph.busy:
            return fn(x)
        return graph(x)

    def _try_capture(self, stage, fn, x, modules, params):
        hooked = [name for name, m in modules.named_modules()
                  if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks
                  or getattr(m, '_backward_pre_hooks', None)]
        if hooked:
            warnings.warn(f'cuda_graphs: stage {stage} runs eagerly: its modules {hooked} '
                          'have hooks, which a replayed graph would skip')
            return _FAILED
        stream = torch.cuda.current_stream() if x.is_cuda else None
        try:
            return self.capture(fn, x, params, self.warmup)
        except RuntimeError as e:  # e.g. an operator that synchronizes with the host
            if stream is not None:  # a failed capture_end leaves its stream current
                torch.cuda.set_stream(stream)
            warnings.warn(f'cuda_graphs: capturing stage {stage} failed, it runs eagerly '
                          f'for inputs of shape {tuple(x.shape)}: {e}')
            return _FAILED

    # A copy (an EMA model, a pickled module) starts without graphs: they hold the
    # addresses of the original's tensors.
    def __deepcopy__(self, memo):
        return StageGraphs(self.min_calls, self.max_graphs, self.warmup, self.capture)

    def __getstate__(self):
        return dict(min_calls=self.min_calls, max_graphs=self.max_graphs,
                    warmup=self.warmup, capture=self.capture)

    def __setstate__(self, state):
        self.__init__(**state)

    def __repr__(self):
        return (f'StageGraphs(min_calls={self.min_calls}, max_graphs={self.max_graphs}, '
                f'captured={self.captured()})')
