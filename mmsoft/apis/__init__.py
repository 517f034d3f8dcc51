"""What the tools share with users: build a backbone or a whole model from a config and
a checkpoint, feed it images (``inference``), train and test it with mmengine's Runner
(``runner``); the options every tool takes (``cli``)."""
from .inference import (dataset_images, init_backbone, init_model, load_image,
                        resolve_checkpoint, to_tensor)
from .runner import build_runner, load_config

__all__ = [
    'build_runner', 'dataset_images', 'init_backbone', 'init_model', 'load_config',
    'load_image', 'resolve_checkpoint', 'to_tensor'
]
