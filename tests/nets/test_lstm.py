import pytest
import torch
import torch.nn.functional as F

from asrkit.nets.lstm import BLSTMEncoder, pyramid_halve


@pytest.fixture(autouse=True)
def one_thread():
    """Small LSTMs are slower, not faster, with several threads on a loaded machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _reference_encode(enc: BLSTMEncoder, x: torch.Tensor) -> torch.Tensor:
    """One unpadded utterance (1, T, F) through the encoder's own LSTMs, no packing, pyramid by hand."""
    for i, lstm in enumerate(enc.layers, start=1):
        x, _ = lstm(x)
        if i in enc.pyramid_layers:
            t = x.size(1)
            pairs = [torch.cat([x[:, 2 * j], x[:, 2 * j + 1] if 2 * j + 1 < t else torch.zeros_like(x[:, 0])], -1)
                     for j in range((t + 1) // 2)]
            x = torch.stack(pairs, dim=1)
    return x


def test_pyramid_halve_pairs_frames_and_pads_odd_lengths():
    x = torch.arange(2 * 5 * 3, dtype=torch.float32).view(2, 5, 3)
    x[1, 4:] = 0  # utterance 2 has length 4: its padding is zero, as pad_packed_sequence leaves it
    y, lens = pyramid_halve(x, torch.tensor([5, 4]))
    assert y.shape == (2, 3, 6)
    assert lens.tolist() == [3, 2]  # ceil(5/2), 4/2
    torch.testing.assert_close(y[0, 1], torch.cat([x[0, 2], x[0, 3]]))
    torch.testing.assert_close(y[0, 2], torch.cat([x[0, 4], torch.zeros(3)]))  # odd: last frame paired with zeros
    assert torch.all(y[1, 2] == 0)


@pytest.mark.parametrize("lengths", [[13, 8, 5, 1], [16, 15, 2, 3]])
def test_pyramid_lengths_halve_with_ceiling(lengths):
    torch.manual_seed(0)
    enc = BLSTMEncoder(6, 5, num_layers=3, dropout=0.0, input_layer="none", pyramid_layers=(1, 2)).eval()
    lens = torch.tensor(lengths)
    out, out_lens, _ = enc(torch.randn(len(lengths), max(lengths), 6), lens)
    expected = [(((n + 1) // 2) + 1) // 2 for n in lengths]
    assert out_lens.tolist() == expected
    assert enc.output_lengths(lens).tolist() == expected
    assert out.shape == (len(lengths), max(expected), 10)
    assert enc.subsampling_factor == 4
    for b, n in enumerate(expected):
        assert torch.all(out[b, n:] == 0)


@pytest.mark.parametrize("pyramid", [(), (1,), (1, 2)])
def test_batched_packed_encoder_matches_unpadded_reference(pyramid):
    torch.manual_seed(0)
    enc = BLSTMEncoder(6, 4, num_layers=3, dropout=0.0, input_layer="none", pyramid_layers=pyramid).eval()
    lengths = [11, 7, 4]
    x = torch.randn(3, 11, 6)
    x[1, 7:] = 100.0  # garbage padding must not leak into valid frames (either direction)
    x[2, 4:] = -50.0
    out, out_lens, _ = enc(x, torch.tensor(lengths))
    for b, n in enumerate(lengths):
        ref = _reference_encode(enc, x[b: b + 1, :n])
        assert ref.size(1) == int(out_lens[b])
        torch.testing.assert_close(out[b: b + 1, : ref.size(1)], ref, atol=1e-5, rtol=1e-5)


def test_conv_front_end_and_padding_invariance():
    torch.manual_seed(0)
    enc = BLSTMEncoder(20, 8, num_layers=2, dropout=0.0, input_layer="conv2d", pyramid_layers=(1,)).eval()
    assert enc.subsampling_factor == 8 and enc.output_dim == 16
    x = torch.randn(1, 45, 20)
    single, n1, _ = enc(x, torch.tensor([45]))
    batch, n2, _ = enc(torch.cat([F.pad(x, (0, 0, 0, 30)), torch.randn(1, 75, 20)]), torch.tensor([45, 75]))
    assert int(n1[0]) == int(n2[0]) == (((45 - 3) // 2 + 1 - 3) // 2 + 1 + 1) // 2  # conv x4 then ceil(/2)
    torch.testing.assert_close(batch[:1, : int(n1[0])], single, atol=1e-5, rtol=1e-5)


def test_too_short_utterance_gets_zero_length_without_crashing():
    enc = BLSTMEncoder(20, 4, num_layers=1, dropout=0.0, input_layer="conv2d").eval()
    out, lens, _ = enc(torch.randn(2, 30, 20), torch.tensor([30, 5]))  # 5 frames < receptive field 7
    assert lens.tolist() == [6, 0]
    assert torch.isfinite(out).all()
    out, lens, _ = enc(torch.randn(1, 5, 20), torch.tensor([5]))
    assert out.shape == (1, 0, 8) and lens.tolist() == [0]


@pytest.mark.parametrize("kwargs, message", [
    (dict(pyramid_layers=(3,)), "pyramid_layers"),
    (dict(pyramid_layers=(0,)), "pyramid_layers"),
    (dict(pyramid_layers=(1, 1)), "pyramid_layers"),
    (dict(input_layer="vgg"), "input_layer"),
])
def test_bad_configuration_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BLSTMEncoder(20, 4, num_layers=3, **kwargs)
