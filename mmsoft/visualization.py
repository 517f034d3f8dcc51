"""Figures of the analysis tools: a matplotlib figure without pyplot, a map over an image."""
import math

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ['figure', 'map_figure']


def figure(width, height, dpi=100):
    """A matplotlib Figure not registered with pyplot (nothing to close, no GUI), laid out
    by matplotlib's constrained layout (titles, colorbars and labels do not overlap)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width, height), dpi=dpi, layout='constrained')
    FigureCanvasAgg(fig)  # a renderer to measure text with
    return fig


def map_figure(image, heat, title, label, marker=None, alpha=0.5, cmap='jet'):
    """``heat`` (h, w), upsampled to the image, over ``image`` (HxWx3 uint8) with a
    colorbar labelled ``label`` and an optional '+' at ``marker`` = (y, x) pixels.
    Small values are shown scaled by a power of ten, which the colorbar label states.

    Returns:
        matplotlib.figure.Figure
    """
    import matplotlib
    heat = torch.as_tensor(heat, dtype=torch.float32)[None, None]
    heat = F.interpolate(heat, size=image.shape[:2], mode='bilinear', align_corners=False)
    heat = heat[0, 0].double().numpy()
    peak = float(np.abs(heat).max())
    exponent = math.floor(math.log10(peak)) if peak > 0 else 0
    if abs(exponent) >= 3:
        heat = heat / 10.0**exponent
        label = f'{label}, ×1e{exponent}'
    H, W = image.shape[:2]
    fig = figure(6.6, 5.4 * H / W + 0.3 + 0.2 * title.count('\n'))
    ax = fig.add_subplot()
    ax.imshow(image)
    norm = matplotlib.colors.Normalize(float(heat.min()), float(heat.max()))
    ax.imshow(heat, cmap=cmap, norm=norm, alpha=alpha)
    if marker is not None:
        ax.plot(marker[1], marker[0], marker='+', color='white', markersize=18,
                markeredgewidth=3)
        ax.plot(marker[1], marker[0], marker='+', color='black', markersize=14,
                markeredgewidth=1.2)
    ax.set_axis_off()
    ax.set_title(title, fontsize=9)
    # The colorbar shows the colormap opaque (the overlay is blended with the image).
    colors = matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap)
    cax = ax.inset_axes([1.03, 0, 0.045, 1])  # as tall as the image
    fig.colorbar(colors, cax=cax, label=label)
    return fig
