"""Teacher-forced score_tokens of the attention models against a decode_step loop."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asrkit.config import load_config
from asrkit.models.registry import build_model

REPO = Path(__file__).resolve().parents[2]
VOCAB = 20
EOS = 2


def decode_step_loop(model, enc, enc_lens, tokens, token_lens) -> torch.Tensor:
    """(B,) sum of log P(y_i | <sos> y_<i) and log P(<eos> | y), one utterance and one token at a time."""
    out = []
    for b in range(enc.shape[0]):
        seq = tokens[b, :int(token_lens[b])].tolist()
        ys = [EOS]
        state, total = None, 0.0
        for target in seq + [EOS]:
            lp, state = model.decode_step(torch.tensor([ys]), enc[b:b + 1], enc_lens[b:b + 1], state)
            total += float(lp[0, target])
            ys.append(target)
        out.append(total)
    return torch.tensor(out)


@pytest.mark.parametrize("conf", ["tiny_transformer.yaml", "tiny_blstm_location_attention.yaml"])
def test_score_tokens_equals_a_decode_step_loop(conf: str) -> None:
    torch.manual_seed(0)
    model = build_model(load_config(REPO / "conf" / conf), VOCAB).eval()
    assert model.decoder is not None
    gen = torch.Generator().manual_seed(1)
    wav_lens = torch.tensor([12000, 8000, 6400, 12000])
    wav = 0.1 * torch.randn(4, 12000, generator=gen)
    token_lens = torch.tensor([5, 0, 3, 7])
    tokens = torch.randint(3, VOCAB, (4, 7), generator=gen)
    tokens[torch.arange(7) >= token_lens[:, None]] = -1
    with torch.no_grad():
        enc, enc_lens = model.encode(wav, wav_lens)
        got = model.score_tokens(enc, enc_lens, tokens, token_lens)
        want = decode_step_loop(model, enc, enc_lens, tokens, token_lens)
    assert got.shape == (4,)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)
    assert (got < 0).all()
