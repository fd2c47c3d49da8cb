"""Transformer decoder: causal masking, memory padding, tied embeddings, incremental decode_step."""
import pytest
import torch

from asrkit.nets.decoder import DecoderState, TransformerDecoder
from asrkit.search.scorers import index_rows


def make(pre_ln=True, tie=False, layers=2):
    torch.manual_seed(0)
    return TransformerDecoder(11, d_model=16, num_heads=4, ffn_dim=32, num_layers=layers,
                              normalize_before=pre_ln, tie_embeddings=tie).eval()


@pytest.mark.parametrize("pre_ln", [True, False])
def test_future_tokens_do_not_change_earlier_outputs(pre_ln):
    dec = make(pre_ln)
    memory, mlens = torch.randn(1, 8, 16), torch.tensor([8])
    ys = torch.tensor([[2, 5, 6, 7, 8]])
    changed = ys.clone()
    changed[0, 3:] = torch.tensor([9, 10])
    a = dec(ys, torch.tensor([5]), memory, mlens)
    b = dec(changed, torch.tensor([5]), memory, mlens)
    torch.testing.assert_close(a[:, :3], b[:, :3])
    assert not torch.allclose(a[:, 3:], b[:, 3:])  # the check can fail: later positions do see the change


def test_padding_of_tokens_and_memory_does_not_change_valid_outputs():
    dec = make()
    memory = torch.randn(1, 8, 16)
    ys = torch.tensor([[2, 5, 6]])
    single = dec(ys, torch.tensor([3]), memory, torch.tensor([8]))
    padded_mem = torch.cat([memory, 100 * torch.randn(1, 5, 16)], 1)
    padded_ys = torch.tensor([[2, 5, 6, 2, 2]])
    batch = dec(padded_ys, torch.tensor([3]), padded_mem, torch.tensor([8]))
    torch.testing.assert_close(batch[:, :3], single, atol=1e-5, rtol=1e-5)


def test_tied_embeddings_share_storage():
    dec = make(tie=True)
    assert dec.output.weight is dec.embed.weight
    assert dec.output.weight.data_ptr() == dec.embed.weight.data_ptr()
    names = [n for n, _ in dec.named_parameters()]
    assert "output.weight" not in names and "embed.weight" in names  # one Parameter, counted once
    untied = make(tie=False)
    assert untied.output.weight.data_ptr() != untied.embed.weight.data_ptr()
    assert sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in dec.parameters()) == 11 * 16


@pytest.mark.parametrize("pre_ln", [True, False])
def test_incremental_decode_step_matches_full_forward(pre_ln):
    dec = make(pre_ln, layers=3)
    memory = torch.randn(3, 9, 16)
    mlens = torch.tensor([9, 6, 4])
    ys = torch.tensor([[2, 3, 4, 5, 6], [2, 7, 7, 1, 9], [2, 10, 3, 3, 4]])
    full = dec(ys, torch.tensor([5, 5, 5]), memory, mlens).log_softmax(-1)  # (N, L, V)
    state = None
    for i in range(1, 6):
        logp, state = dec.decode_step(ys[:, :i], memory, mlens, state)
        assert len(state.self_kv) == 3 and all(t.shape == (3, 4, i, 4) for kv in state.self_kv for t in kv)
        assert len(state.memory_kv) == 3 and all(t.shape == (3, 4, 9, 4) for kv in state.memory_kv for t in kv)
        torch.testing.assert_close(logp, full[:, i - 1], atol=1e-5, rtol=1e-5)
        fresh, _ = dec.decode_step(ys[:, :i], memory, mlens, None)  # recompute from scratch
        torch.testing.assert_close(logp, fresh, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="state covers"):
        dec.decode_step(ys[:, :2], memory, mlens, state)


def test_state_reorders_along_the_batch_dim():
    dec = make()
    memory, mlens = torch.randn(2, 6, 16), torch.tensor([6, 5])
    ys = torch.tensor([[2, 4], [2, 8]])
    _, state = dec.decode_step(ys, memory, mlens)
    index = torch.tensor([1, 1, 0])
    state = index_rows(state, index)
    assert isinstance(state, DecoderState)
    nxt = torch.tensor([[3], [5], [6]])
    logp, _ = dec.decode_step(torch.cat([ys[index], nxt], 1), memory[index], mlens[index], state)
    ref, _ = dec.decode_step(torch.cat([ys[index], nxt], 1), memory[index], mlens[index])
    torch.testing.assert_close(logp, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pre_ln", [True, False])
def test_cached_memory_projection_matches_from_scratch_steps_under_reordering(pre_ln):
    """Every step: the carried state (projected memory keys/values included), reordered by index_select
    like the beam search does, gives the same log-probs and state as decoding the reordered prefixes anew."""
    dec = make(pre_ln)
    gen = torch.Generator().manual_seed(3)
    n, t = 5, 9
    memory = torch.randn(n, t, 16, generator=gen)
    mlens = torch.tensor([9, 7, 4, 9, 2])  # padded frames hold large values: they must stay masked out
    memory = memory.masked_fill(torch.arange(t)[None, :, None] >= mlens[:, None, None], 50.0)
    ys = torch.full((n, 1), 2)
    logp, state = dec.decode_step(ys, memory, mlens)
    for _ in range(6):
        index = torch.randint(0, n, (n,), generator=gen)  # rows move, duplicate and vanish
        ys = torch.cat([ys[index], torch.randint(3, 11, (n, 1), generator=gen)], 1)
        memory, mlens = memory[index], mlens[index]
        logp, state = dec.decode_step(ys, memory, mlens, index_rows(state, index))
        fresh, fresh_state = dec.decode_step(ys, memory, mlens, None)
        torch.testing.assert_close(logp, fresh, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(state.self_kv, fresh_state.self_kv, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(state.memory_kv, fresh_state.memory_kv, atol=0, rtol=0)  # moved, not recomputed
        full = dec(ys, torch.full((n,), ys.size(1)), memory, mlens).log_softmax(-1)[:, -1]  # training path
        torch.testing.assert_close(logp, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pre_ln", [True, False])
def test_cached_self_attention_keys_values_equal_fresh_projections(pre_ln):
    """After steps with reordered rows, each layer's cached self-attention keys/values equal those projected
    from the layer inputs of a training-style pass over the whole prefix: of norm1(input) for pre-LN, of
    the input itself for post-LN."""
    dec = make(pre_ln, layers=3)
    gen = torch.Generator().manual_seed(5)
    n, t = 4, 7
    memory, mlens = torch.randn(n, t, 16, generator=gen), torch.tensor([7, 3, 5, 1])
    ys = torch.full((n, 1), 2)
    _, state = dec.decode_step(ys, memory, mlens)
    for _ in range(5):
        index = torch.randint(0, n, (n,), generator=gen)
        ys = torch.cat([ys[index], torch.randint(3, 11, (n, 1), generator=gen)], 1)
        memory, mlens = memory[index], mlens[index]
        _, state = dec.decode_step(ys, memory, mlens, index_rows(state, index))
    length = ys.size(1)
    x = dec.pos(dec.embed(ys))  # (N, L, D) the first layer's input
    memory_mask = torch.arange(t)[None, None, :] < mlens[:, None, None]
    for layer, (k, v) in zip(dec.layers, state.self_kv):
        h = layer.norm1(x) if pre_ln else x
        ref_k, ref_v = layer.self_attn.project_kv(h, h)  # (N, H, L, Dh)
        assert k.shape == ref_k.shape == (n, 4, length, 4)
        torch.testing.assert_close(k, ref_k, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v, ref_v, atol=1e-5, rtol=1e-5)
        x = layer(x, torch.ones(1, length, length, dtype=torch.bool).tril(), memory, memory_mask)


def test_projected_source_attention_equals_forward():
    dec = make()
    attn = dec.layers[0].src_attn
    q, mem = torch.randn(3, 4, 16), torch.randn(3, 7, 16)
    mask = torch.tensor([[True] * 7, [True] * 3 + [False] * 4, [False] * 7]).unsqueeze(1)  # incl. an empty row
    torch.testing.assert_close(attn.forward_projected(q, *attn.project_kv(mem, mem), mask), attn(q, mem, mem, mask),
                               atol=0, rtol=0)


def test_decode_step_rejects_a_state_for_other_memory_or_of_another_kind():
    dec = make()
    memory, mlens = torch.randn(2, 6, 16), torch.tensor([6, 5])
    ys = torch.tensor([[2, 4], [2, 8]])
    _, state = dec.decode_step(ys, memory, mlens)
    longer = torch.cat([ys, ys[:, :1]], 1)
    with pytest.raises(ValueError, match="6 frames, memory has 8"):
        dec.decode_step(longer, torch.randn(2, 8, 16), mlens, state)
    with pytest.raises(TypeError, match="DecoderState"):
        dec.decode_step(longer, memory, mlens, tuple(state.self_kv))


def test_attention_weights_are_distributions_over_valid_frames():
    dec = make()
    w = dec.attention_weights(torch.tensor([[2, 5, 6], [2, 7, 2]]), torch.tensor([3, 2]),
                              torch.randn(2, 7, 16), torch.tensor([7, 4]))
    assert w.shape == (2, 3, 7)  # (B, L, T), averaged over the heads
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3))
    assert float(w[1, :, 4:].sum()) == 0.0
