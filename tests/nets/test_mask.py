"""Padding, causal and chunk masks against straightforward loops over (query, key) pairs."""
import pytest
import torch

from asrkit.nets.mask import causal_mask, chunk_mask, lengths_to_mask


def chunk_mask_reference(size, chunk, left):
    """Query t sees key s when s's chunk is t's or one of the ``left`` before it (all before when left < 0)."""
    allowed = torch.zeros(size, size, dtype=torch.bool)
    for t in range(size):
        for s in range(size):
            if chunk <= 0:
                allowed[t, s] = True
                continue
            start = 0 if left < 0 else max(t // chunk - left, 0) * chunk
            end = (t // chunk + 1) * chunk  # exclusive: the end of t's chunk
            allowed[t, s] = start <= s < end
    return allowed


@pytest.mark.parametrize("size,chunk,left", [(1, 1, -1), (7, 1, 0), (7, 1, 2), (10, 3, -1), (10, 3, 0),
                                             (10, 3, 1), (11, 4, 2), (9, 9, -1), (5, 8, 0), (8, 0, 1),
                                             (6, -1, 0), (12, 2, 5)])
def test_chunk_mask_matches_a_loop(size, chunk, left):
    """Catches chunk boundaries not at multiples of chunk_frames from frame 0, a chunk that sees the next one,
    an off-by-one in the left context (left_chunks chunks, not left_chunks - 1 or + 1) and -1 not meaning all."""
    torch.testing.assert_close(chunk_mask(size, chunk, left), chunk_mask_reference(size, chunk, left))


def test_chunk_mask_defaults_and_shape():
    """Catches a default left context other than all earlier chunks, and a mask on the wrong device or dtype."""
    m = chunk_mask(6, 2, device=torch.device("cpu"))
    assert m.dtype == torch.bool and m.shape == (6, 6) and m.device.type == "cpu"
    torch.testing.assert_close(m, chunk_mask_reference(6, 2, -1))
    assert chunk_mask(4, 4).all() and not chunk_mask(4, 1).triu(1).any()  # one chunk = full; chunks of 1 = causal


def test_lengths_and_causal_masks():
    """Catches ``<=`` for ``<`` in the padding mask, a max_len ignored, and a causal mask that sees the future."""
    lens = torch.tensor([3, 0, 5])
    ref = torch.tensor([[t < n for t in range(6)] for n in lens.tolist()])
    torch.testing.assert_close(lengths_to_mask(lens, 6), ref)
    torch.testing.assert_close(lengths_to_mask(lens), ref[:, :5])
    torch.testing.assert_close(causal_mask(4), torch.tensor([[s <= t for s in range(4)] for t in range(4)]))


def test_masks_are_made_on_the_requested_device():
    """Catches a mask built on the CPU for inputs on another device (a host-device copy per batch, or an error
    on a GPU). The meta device stands in for a GPU: tensors there have a device and no data."""
    meta = torch.device("meta")
    assert chunk_mask(6, 2, 1, device=meta).device == meta and chunk_mask(6, 0, device=meta).device == meta
    assert causal_mask(3, meta).device == meta
    assert lengths_to_mask(torch.tensor([2, 3], device=meta), 4).device == meta
