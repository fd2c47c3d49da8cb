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
