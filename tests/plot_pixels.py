"""What a report panel's PNG shows, measured in pixels: the coloured (plotted) pixels inside its data area and
whether that area's left and bottom edges are the axes' spines (so the box the page gives is the real one)."""

from __future__ import annotations

import io

import numpy as np
from matplotlib import image


def pixels(png: bytes) -> np.ndarray:
    """RGB in 0..1, rows from the top."""
    return np.asarray(image.imread(io.BytesIO(png), format="png"))[:, :, :3]


def coloured_pixels(png: bytes, box: tuple[int, int, int, int]) -> int:
    """Pixels inside ``box`` (left, top, right, bottom; the spines left out) whose colour is not white, grey
    or black: plotted lines and markers (grid lines, event marks and text are grey or black)."""
    left, top, right, bottom = box
    area = pixels(png)[top + 2 : bottom - 2, left + 2 : right - 2]
    saturation = area.max(axis=2) - area.min(axis=2)
    return int((saturation > 0.25).sum())


def spines_at(png: bytes, box: tuple[int, int, int, int]) -> bool:
    """Whether a dark line runs along the box's left and bottom edges (within a pixel)."""
    img = pixels(png).mean(axis=2)
    left, top, right, bottom = box

    def dark(line: np.ndarray) -> bool:
        return bool((line < 0.4).mean() > 0.9)

    cols = any(dark(img[top + 2 : bottom - 2, c]) for c in (left - 1, left, left + 1))
    rows = any(dark(img[r, left + 2 : right - 2]) for r in (bottom - 1, bottom, bottom + 1))
    return cols and rows
