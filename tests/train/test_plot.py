"""Attention images from a synthetic (L, T) matrix."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from asrkit.train.plot import plot_attention


def diagonal(length: int, frames: int) -> torch.Tensor:
    """A monotonic alignment: row l peaks at frame l * T / L."""
    centres = (torch.arange(length) + 0.5) * frames / length
    w = torch.exp(-0.5 * ((torch.arange(frames)[None, :] - centres[:, None]) / 1.5) ** 2)
    return w / w.sum(-1, keepdim=True)


def test_writes_a_png_whose_image_follows_the_matrix(tmp_path):
    import matplotlib.image as mpimg

    w = diagonal(8, 40)
    a, b = tmp_path / "sub" / "diag.png", tmp_path / "flip.png"
    plot_attention(w, a, title="utt1", tokens=list("ABCDEFG") + ["<eos>"], frame_shift=0.04)
    plot_attention(w.flip(0).numpy(), b, title="utt1", tokens=list("ABCDEFG") + ["<eos>"], frame_shift=0.04)
    assert a.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img_a, img_b = mpimg.imread(a), mpimg.imread(b)
    assert img_a.shape == img_b.shape and img_a.shape[2] in (3, 4)
    assert img_a.std() > 0.05  # not blank
    assert np.abs(img_a - img_b).mean() > 0.005  # the drawing depends on the weights


@pytest.mark.parametrize("shape", [(3,), (2, 3, 4), (0, 5)])
def test_rejects_anything_but_a_non_empty_matrix(tmp_path, shape):
    with pytest.raises(ValueError, match="non-empty \\(L, T\\) matrix"):
        plot_attention(torch.zeros(shape), tmp_path / "x.png")
