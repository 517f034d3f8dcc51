"""mmcv._ext where mmcv has no compiled ops (mmcv-lite, as on the GPU machine): setup.sh
puts it in place. mmcv.ops asks for its ops when imported (mmdet imports it); each one
raises when called. The detector steps run through mmcv_ops.py, which takes this module's
place and serves the ops they call."""


def __getattr__(name):
    if name.startswith('__'):
        raise AttributeError(name)

    def op(*args, **kwargs):
        raise RuntimeError(f'mmcv has no compiled op {name!r} here (mmcv-lite): run the step '
                           'through projects/soft_lab/gpu/mmcv_ops.py')
    return op
