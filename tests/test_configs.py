"""Every conf/*.yaml loads, builds its model and survives one forward/backward step.

Neural LM configs (``lm_*.yaml``, ``tiny_lm_*.yaml``, for ``asrkit train-lm``) are LMExperimentConfigs:
they build an LM and take one optimizer step instead. Decoding configs (``decode_*.yaml``) are DecodeConfigs,
checked against a model here and run in tests/pipeline.
"""
import pathlib

import pytest
import torch
import torch.nn.functional as F

from asrkit.config import load_config, load_decode_config, load_lm_config
from asrkit.lm.neural import IGNORE_ID, build_lm, make_lm_batch
from asrkit.models.registry import build_model
from asrkit.train.lm_task import check_lm_train_config
from asrkit.train.optim import build_optimizer

CONF = pathlib.Path(__file__).resolve().parents[1] / "conf"


def is_lm_config(path: pathlib.Path) -> bool:
    return path.name.startswith(("lm_", "tiny_lm_"))


def is_decode_config(path: pathlib.Path) -> bool:
    return path.name.startswith("decode_")


CONFIGS = sorted(p for p in CONF.glob("*.yaml") if not is_lm_config(p) and not is_decode_config(p))
LM_CONFIGS = sorted(p for p in CONF.glob("*.yaml") if is_lm_config(p))
DECODE_CONFIGS = sorted(p for p in CONF.glob("*.yaml") if is_decode_config(p))


@pytest.mark.parametrize("path", DECODE_CONFIGS, ids=lambda p: p.name)
def test_decode_config_fits_the_models_that_can_run_it(path):
    """Catches a decode config whose mode is not the one its file names, one the joint model cannot run,
    and a mode check that lets a CTC-only model into a search that needs a decoder."""
    from asrkit.config import ConfigError
    from asrkit.pipeline.searcher import check_decode_config

    cfg = load_decode_config(path)
    assert path.stem.startswith(f"decode_{cfg.mode}")  # decode_ctc_prefix_lm.yaml -> ctc_prefix
    check_decode_config(cfg, build_model(load_config(CONF / "tiny_transformer.yaml"), vocab_size=30))
    ctc_only = build_model(load_config(CONF / "tiny_ctc.yaml"), vocab_size=30)
    if cfg.mode in ("greedy", "ctc_prefix"):
        check_decode_config(cfg, ctc_only)
    else:
        with pytest.raises(ConfigError, match="needs an attention decoder"):
            check_decode_config(cfg, ctc_only)


def test_every_model_family_and_decoding_mode_has_configs():
    """Catches a model family or a decoding mode shipped without a config (a file count would not)."""
    from asrkit.models.registry import DECODERS, ENCODERS
    from asrkit.pipeline.searcher import MODES

    def kinds(paths):
        cfgs = [load_config(p).model for p in paths]
        return {c.encoder.kind for c in cfgs}, {c.decoder.kind for c in cfgs}

    assert kinds(CONFIGS) == (set(ENCODERS), set(DECODERS))
    tiny = [p for p in CONFIGS if p.name.startswith("tiny_")]
    assert kinds(tiny) == (set(ENCODERS), set(DECODERS))  # each part trains in the tests and on a CPU
    assert {load_decode_config(p).mode for p in DECODE_CONFIGS} == set(MODES)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_states_its_frontend_window_and_dither(path):
    """window and dither default by frontend kind (kaldi_fbank: Kaldi's povey and 1.0): a shipped config says
    which it uses instead of leaving the reader to know the kind's defaults."""
    import yaml

    frontend = yaml.safe_load(path.read_text(encoding="utf-8"))["frontend"]
    assert {"kind", "window", "dither"} <= set(frontend), path.name
    cfg = load_config(path).frontend
    assert (cfg.kind, cfg.window, cfg.dither) == (frontend["kind"], frontend["window"], frontend["dither"])


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_builds_and_trains_one_step(path, tmp_path):
    cfg = load_config(path)
    torch.manual_seed(0)
    cmvn = None
    if cfg.frontend.utterance_cmn == "causal" and cfg.frontend.utterance_cmn_prior_frames > 0:
        # the running mean's prior is the global CMVN mean: the recipe computes the stats, any will do here
        from asrkit.audio.cmvn import CMVNStats
        stats = CMVNStats()
        stats.update(torch.randn(1, 50, cfg.frontend.n_mels))
        cmvn = str(tmp_path / "cmvn.json")
        stats.save(cmvn)
    model = build_model(cfg, vocab_size=30, cmvn_path=cmvn)
    model.train()
    sr = cfg.frontend.sample_rate
    batch = {"wav": 0.1 * torch.randn(2, sr), "wav_lens": torch.tensor([sr, 3 * sr // 4]),  # 1 s and 0.75 s
             "tokens": torch.tensor([[5, 6, 7, 8], [9, 9, -1, -1]]), "token_lens": torch.tensor([4, 2]),
             "utts": ["a", "b"], "texts": ["x", "y"]}
    out = model(batch)
    assert out["loss"].dim() == 0 and torch.isfinite(out["loss"]), path.name
    assert torch.isfinite(out["loss_ctc"]) and int(out["num_infinite_ctc"]) == 0
    out["loss"].backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads), path.name
    assert model.vocab_size == 30 and model.subsampling_factor in (1, 2, 4, 6, 8)


def test_there_are_lm_configs():
    assert {p.name for p in LM_CONFIGS} >= {"lm_lstm.yaml", "lm_transformer.yaml", "tiny_lm_lstm.yaml",
                                            "tiny_lm_transformer.yaml"}


@pytest.mark.parametrize("path", LM_CONFIGS, ids=lambda p: p.name)
def test_lm_config_builds_and_trains_one_step(path):
    cfg = load_lm_config(path)
    check_lm_train_config(cfg)
    torch.manual_seed(0)
    lm = build_lm(cfg.model, vocab_size=30).train()
    optimizer = build_optimizer(lm, cfg.train)
    ys_in, ys_out = make_lm_batch([[5, 6, 7, 8], [9, 9]])
    rng = torch.get_rng_state()
    out = lm({"ys_in": ys_in, "ys_out": ys_out})  # the trainer's call
    assert out["loss"].dim() == 0 and torch.isfinite(out["loss"]), path.name
    torch.set_rng_state(rng)  # the same dropout masks again
    logits = lm.logits(ys_in)
    assert logits.shape == (2, 5, 30), path.name
    # per target token: 4 + 1 and 2 + 1 targets, the padding of the second row excluded
    expected = F.cross_entropy(logits.flatten(0, 1), ys_out.flatten(), ignore_index=IGNORE_ID, reduction="sum") / 8
    torch.testing.assert_close(out["loss"], expected)
    out["loss"].backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in lm.parameters()), path.name
    before = [p.detach().clone() for p in lm.parameters()]
    optimizer.step()
    assert any(not torch.equal(a, p) for a, p in zip(before, lm.parameters())), path.name


# Deja-vu as Tjandra et al. 2020 (sec. 3, Fig. 2) train it: the iterated loss, Z0 = the input features, one split.
PAPER_DEJAVU = {"model.intermediate_loss": ("iterated",), "model.encoder.dejavu_input": ("stacked_fbank",),
                "model.encoder.dejavu_combine": ("a", "b")}


@pytest.mark.parametrize("path", [p for p in CONFIGS if "dejavu" in p.name], ids=lambda p: p.name)
def test_dejavu_config_header_says_what_differs_from_the_paper(path):
    """A config named Deja-vu that leaves the paper's setting says so in its header, naming each key."""
    from asrkit.config import flatten_dict, to_dict

    flat = flatten_dict(to_dict(load_config(path)))
    header = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    header = " ".join(header)
    assert flat["model.encoder.dejavu_layer"] > 0, path.name
    differ = [key for key, paper in PAPER_DEJAVU.items() if flat[key] not in paper]
    if differ:
        assert "extension of Deja-vu" in header and "not the paper's setting" in header, path.name
    for key in differ:
        assert f"{key}: {flat[key]}" in header, (path.name, key)
    # asrkit has no VGG front end: a config holding the paper's setting says what stands in for it.
    assert differ or ("VGG" in header and f"model.encoder.input_layer: {flat['model.encoder.input_layer']}" in header)
