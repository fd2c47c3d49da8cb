import pytest
import torch

from asrkit.nets.subsampling import Conv2dSubsampling


@pytest.mark.parametrize("factor", [4, 6, 8])
def test_output_lengths_match_real_convolutions(factor):
    torch.manual_seed(0)
    sub = Conv2dSubsampling(in_dim=20, d_model=8, factor=factor).eval()
    for n in range(sub.min_input_length, 90, 3):
        out, lens = sub(torch.randn(1, n, 20), torch.tensor([n]))
        assert out.shape[1] == int(lens[0]), n
    assert int(sub.output_lengths(torch.tensor([sub.min_input_length - 1]))[0]) == 0


@pytest.mark.parametrize("factor", [4, 6, 8])
def test_padding_does_not_change_valid_frames(factor):
    torch.manual_seed(0)
    sub = Conv2dSubsampling(in_dim=20, d_model=8, factor=factor).eval()
    x = torch.randn(1, 57, 20)
    single, n1 = sub(x, torch.tensor([57]))
    padded = torch.cat([x, torch.randn(1, 30, 20)], dim=1)
    batch, n2 = sub(padded, torch.tensor([57]))
    assert int(n1[0]) == int(n2[0])
    torch.testing.assert_close(batch[:, : int(n1[0])], single)


def test_rate_is_the_factor():
    sub = Conv2dSubsampling(in_dim=80, d_model=4, factor=4)
    assert int(sub.output_lengths(torch.tensor([1000]))[0]) == 249  # ((1000-3)//2+1 - 3)//2 + 1


def _reference_forward(sub: Conv2dSubsampling, x: torch.Tensor, lengths: torch.Tensor):
    """The straightforward computation: contiguous convolutions, ReLU, (C, F') flattening, projection."""
    h = x.unsqueeze(1)
    for conv in sub.conv[::2]:
        h = torch.relu(torch.nn.functional.conv2d(h, conv.weight.contiguous(), conv.bias, conv.stride))
    b, c, t, f = h.shape
    return sub.pos(sub.out(h.transpose(1, 2).reshape(b, t, c * f))), sub.output_lengths(lengths)


@pytest.mark.parametrize("factor, channels", [(4, 0), (6, 5), (8, 0)])
def test_channels_last_path_equals_reference_with_gradients(factor, channels):
    torch.manual_seed(0)
    sub = Conv2dSubsampling(in_dim=40, d_model=12, factor=factor, channels=channels).eval()
    assert all(c.weight.is_contiguous(memory_format=torch.channels_last) for c in sub.conv[::2])
    x = torch.randn(3, 70, 40)
    lens = torch.tensor([70, 55, 31])
    out, out_lens = sub(x, lens)
    grads = torch.autograd.grad(out.square().sum(), list(sub.parameters()))
    ref, ref_lens = _reference_forward(sub, x, lens)
    ref_grads = torch.autograd.grad(ref.square().sum(), list(sub.parameters()))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(out_lens, ref_lens)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)


def test_state_dict_round_trip_keeps_values_and_layout():
    torch.manual_seed(0)
    a = Conv2dSubsampling(in_dim=20, d_model=8)
    plain = {k: v.contiguous() for k, v in a.state_dict().items()}  # as an older checkpoint holds them
    b = Conv2dSubsampling(in_dim=20, d_model=8)
    b.load_state_dict(plain)
    assert all(torch.equal(b.state_dict()[k], v) for k, v in plain.items())
    assert b.conv[2].weight.is_contiguous(memory_format=torch.channels_last)


def test_training_loss_unchanged_on_a_fixed_batch():
    """The whole tiny_ctc model at ESPnet's subsampling size: loss and gradients as with the reference
    subsampling (same seed, so the same dropout and SpecAugment draws)."""
    from pathlib import Path

    from asrkit.config import load_config
    from asrkit.models.registry import build_model

    cfg = load_config(Path(__file__).resolve().parents[2] / "conf" / "tiny_ctc.yaml",
                      ["model.encoder.conv_channels=144"])
    torch.manual_seed(0)
    model = build_model(cfg, vocab_size=31).train()
    gen = torch.Generator().manual_seed(1)
    wav_lens = torch.tensor([32000, 24000, 17000])
    batch = {"wav": 0.1 * torch.randn(3, 32000, generator=gen), "wav_lens": wav_lens,
             "tokens": torch.randint(3, 31, (3, 12), generator=gen), "token_lens": torch.tensor([12, 9, 7])}
    sub = model.encoder.subsampling

    def loss_and_grads(reference: bool):
        torch.manual_seed(5)
        if reference:
            sub.forward = lambda x, lengths: _reference_forward(sub, x, lengths)
        try:
            loss = model(batch)["loss"]
        finally:
            sub.__dict__.pop("forward", None)
        return loss.detach(), torch.autograd.grad(loss, [sub.conv[2].weight, sub.out.weight])

    loss, grads = loss_and_grads(False)
    ref_loss, ref_grads = loss_and_grads(True)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=0)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-3, atol=1e-4)
