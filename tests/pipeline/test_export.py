"""Export (ONNX, TorchScript) of frontend + CMVN + encoder + CTC head: the exported graph's log-probs equal the eager
model's on synthesized speech, for batch sizes and lengths other than the export example's, and the file alone is
enough to decode (tokenizer, sample rate, frame shift)."""
from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from asrkit.audio.cmvn import CMVNStats
from asrkit.audio.io import load_audio
from asrkit.checkpoint import save_model_weights
from asrkit.cli import main
from asrkit.config import load_config, save_config
from asrkit.extras import MissingExtraError
from asrkit.models.registry import build_model
from asrkit.pipeline.export import (CtcLogProbs, ExportError, _example, check_exportable, export_from_dir,
                                    export_model, load_exported)
from asrkit.pipeline.transcriber import load_from_dir, pad_waveforms
from asrkit.search.greedy import greedy_search
from asrkit.text.tokenizer import CharTokenizer, train_sentencepiece

REPO = Path(__file__).resolve().parents[2]
SENTENCES = ["THE CAT SAT ON THE MAT", "A DOG RAN IN THE PARK", "BIRDS SING IN THE MORNING", "SHE READ A GOOD BOOK",
             "WE WALKED HOME TOGETHER", "THE SUN IS VERY WARM", "HE DRANK A CUP OF TEA", "MY FRIEND LIKES MUSIC"]
pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

# Max abs difference of valid-frame log-probs, exported vs eager (float32 both). Seen: ONNX up to 2e-5 (its
# log-mel is a DFT convolution, not an FFT; conf/tiny_*.yaml at full size on espeak speech), TorchScript 0 (the
# same kernels), BLSTM 5e-7. Log-probs of these random-weight models span about [-8, 0].
TOLERANCE = 1e-4
COMMON = ["specaug.enabled=false", "tokenizer.path=tokenizer.json", "cmvn=cmvn.json"]
SMALL = ["model.encoder.d_model=64", "model.encoder.num_heads=2", "model.encoder.ffn_dim=128",
         "model.encoder.num_layers=1"]
# tiny_ctc: Transformer + CTC, char tokenizer; tiny_conformer: rotary Conformer + CTC + attention decoder (which
# export leaves out), sentencepiece tokenizer; tiny_blstm_ctc: BiLSTM with a pyramid step (odd lengths pad).
MODELS = {"tiny_ctc": ("char", SMALL),
          "tiny_conformer": ("sentencepiece", SMALL + ["model.decoder.num_layers=1", "model.decoder.ffn_dim=128"]),
          "tiny_blstm_ctc": ("char", ["model.encoder.hidden_size=32", "model.encoder.num_layers=2",
                                      "model.encoder.pyramid_layers=[1]"])}


def _speech(tmp_path) -> list:
    """Three utterances of different lengths: espeak-ng speech, or a synthetic voiced signal without it."""
    texts = SENTENCES[:3]
    if shutil.which("espeak-ng"):
        wavs = []
        for i, text in enumerate(texts):
            path = tmp_path / f"utt{i}.wav"
            subprocess.run(["espeak-ng", "-s", str(150 + 20 * i), "-w", str(path), text], check=True)
            wavs.append(load_audio(str(path), 16000))
        return wavs
    gen = torch.Generator().manual_seed(1)
    wavs = []
    for seconds in (1.7, 2.3, 1.1):
        t = torch.arange(int(seconds * 16000)) / 16000
        f0 = 120 + 40 * torch.sin(2 * math.pi * 0.7 * t)
        wavs.append(0.3 * torch.sin(2 * math.pi * torch.cumsum(f0, 0) / 16000) + 0.01 * torch.randn(t.numel(),
                                                                                                   generator=gen))
    return wavs


def _make_exp(root, name: str) -> str:
    """An experiment dir with random weights, a tokenizer and CMVN stats that are far from identity."""
    kind, extra = MODELS[name]
    exp = root / name
    exp.mkdir()
    tok = (CharTokenizer.train(SENTENCES) if kind == "char"
           else train_sentencepiece(SENTENCES, vocab_size=40))
    tok.save(exp / "tokenizer.json")
    stats = CMVNStats(80)
    gen = torch.Generator().manual_seed(2)
    stats.update(torch.randn(500, 80, generator=gen) * torch.linspace(1, 4, 80) - 8.0)
    stats.save(exp / "cmvn.json")
    cfg = load_config(REPO / "conf" / f"{name}.yaml", COMMON + extra)
    save_config(cfg, exp / "config.yaml")
    torch.manual_seed(0)
    save_model_weights(build_model(cfg, tok.vocab_size, str(exp / "cmvn.json")), exp / "model.pt")
    return str(exp)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """name -> (exp dir, eager model, tokenizer, {format: file}); the ONNX files through the CLI."""
    root = tmp_path_factory.mktemp("export")
    out = {}
    for name in MODELS:
        exp = _make_exp(root, name)
        model, _, tok = load_from_dir(exp)
        files = {"onnx": root / f"{name}.onnx", "torchscript": root / f"{name}.ts"}
        assert main(["export", "--model", exp, "--format", "onnx", str(files["onnx"])]) == 0
        export_from_dir(exp, str(files["torchscript"]), "torchscript")
        out[name] = (exp, model, tok, files)
    return out


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    wav, lens = pad_waveforms(_speech(tmp_path_factory.mktemp("speech")))
    return wav, lens


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
@pytest.mark.parametrize("name", list(MODELS))
def test_exported_log_probs_equal_eager_on_other_lengths(exported, speech, name, fmt):
    _, model, tok, files = exported[name]
    wav, lens = speech
    example_wav, _ = _example(model, 16000)
    assert wav.size(0) == 3 and wav.size(1) != example_wav.size(1) and len(set(lens.tolist())) == 3
    if name == "tiny_blstm_ctc":  # a pyramid step pads odd lengths: the batch's parity is not the example's
        def frames(n: int) -> int:
            return int(model.encoder.subsampling.output_lengths(model.frontend.num_frames(torch.tensor(n))))
        assert frames(wav.size(1)) % 2 != frames(example_wav.size(1)) % 2
    with torch.inference_mode():
        enc, ref_lens = model.encode(wav, lens)
        ref = model.ctc_log_probs(enc)  # (B, T, V)
    em = load_exported(files[fmt], num_threads=1, trust_torchscript=True)  # our own files
    got, got_lens = em.log_probs(wav, lens)
    assert got.dtype == torch.float32 and got_lens.dtype == torch.int64
    assert got.shape == ref.shape and torch.equal(got_lens, ref_lens)
    valid = torch.arange(ref.size(1))[None, :] < ref_lens[:, None]  # (B, T)
    assert (got - ref).abs()[valid].max().item() <= TOLERANCE
    # the same greedy transcript, token for token
    as_lists = [[h.tokens for h in hyps] for hyps in greedy_search(got, got_lens).to_lists()]
    assert as_lists == [[h.tokens for h in hyps] for hyps in greedy_search(ref, ref_lens).to_lists()]
    # one row alone (batch 1, another length again) gives that row's log-probs
    one, one_len = em.log_probs(wav[2:3, : int(lens[2])], lens[2:3])
    assert (one[0, : int(one_len[0])] - ref[2, : int(ref_lens[2])]).abs().max().item() <= TOLERANCE


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_metadata_round_trips(exported, fmt):
    for name, (exp, model, tok, files) in exported.items():
        em = load_exported(files[fmt], trust_torchscript=True)
        assert em.sample_rate == 16000
        factor = 8 if "blstm" in name else 4  # x4 convolution, x2 pyramid step
        assert em.frame_shift == pytest.approx(0.01 * factor)  # 10 ms hop x subsampling
        assert em.tokenizer.token_list == tok.token_list
        assert type(em.tokenizer) is type(tok)
        text = "THE CAT SAT ON THE MAT"
        assert em.tokenizer.encode(text) == tok.encode(text)
        assert em.tokenizer.decode(tok.encode(text)) == text


def test_a_torchscript_trace_is_refused_on_another_device(exported):
    em = load_exported(exported["tiny_ctc"][3]["torchscript"], trust_torchscript=True)
    assert em._meta["device"] == "cpu"
    with pytest.raises(ExportError, match="runs on cpu.*not cuda: export again with --device cuda"):
        load_exported(exported["tiny_ctc"][3]["torchscript"], device="cuda", trust_torchscript=True)


def test_short_inputs_and_empty_batches(exported):
    _, model, _, files = exported["tiny_ctc"]
    em = load_exported(files["onnx"])
    lp, lens = em.log_probs(torch.zeros(2, 100), torch.tensor([100, 50]))  # shorter than one encoder frame
    assert lens.tolist() == [0, 0]
    assert int(model.output_lengths(torch.tensor([100]))[0]) == 0
    lp, lens = em.log_probs(torch.zeros(0, 16000), torch.zeros(0, dtype=torch.long))
    assert lp.shape == (0, 0, em.tokenizer.vocab_size) and lens.shape == (0,)
    # The Transformer's positional table bounds the length (5000 frames of 40 ms); the Conformer's rotary
    # positions do not (its decoder's table is not in the graph).
    assert em._meta["max_samples"] / 16000 == pytest.approx(200, abs=0.1)
    assert load_exported(exported["tiny_conformer"][3]["onnx"])._meta["max_samples"] is None
    too_long = em._meta["max_samples"] + 1
    with pytest.raises(ValueError, match="longer than this exported model takes"):
        em.log_probs(torch.zeros(1, too_long), torch.tensor([too_long]))


def test_without_the_export_extra_onnx_is_one_line_naming_it(exported, not_installed, tmp_path, capsys):
    exp, _, _, files = exported["tiny_ctc"]
    not_installed("onnxscript")  # what torch.onnx.export(dynamo=True) writes with
    assert main(["export", "--model", exp, "--format", "onnx", str(tmp_path / "m.onnx")]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "asrkit: exporting to ONNX needs onnxscript, which is not installed: pip install -e '.[export]' (in the asrkit checkout)"]
    assert list(tmp_path.iterdir()) == []
    not_installed("onnxruntime")
    with pytest.raises(MissingExtraError, match=r"tiny_ctc.onnx: an ONNX model needs onnxruntime, .*\[export\]' \(in the asrkit checkout\)$"):
        load_exported(files["onnx"])


def test_a_model_without_ctc_is_refused(tmp_path):
    cfg = load_config(REPO / "conf" / "tiny_conformer.yaml",
                      SMALL + ["model.ctc_weight=0.0", "model.decoder.num_layers=1"])
    model = build_model(cfg, 20)
    with pytest.raises(ExportError, match="no CTC head"):
        CtcLogProbs(model)
    with pytest.raises(ExportError, match="no CTC head"):
        export_model(model, CharTokenizer.train(["AB"]), 16000, str(tmp_path / "m.onnx"), "onnx")
    assert not (tmp_path / "m.onnx").exists()


def test_a_per_utterance_frontend_and_unknown_formats_are_refused():
    cfg = load_config(REPO / "conf" / "tiny_ctc.yaml", SMALL + ["frontend.kind=kaldi_fbank", "frontend.window=povey"])
    with pytest.raises(ExportError, match="kaldi_fbank .* cannot be exported with a dynamic batch"):
        check_exportable(build_model(cfg, 20), "onnx")
    with pytest.raises(ExportError, match="unknown export format 'tflite'"):
        check_exportable(build_model(load_config(REPO / "conf" / "tiny_ctc.yaml", SMALL), 20), "tflite")


@pytest.mark.filterwarnings("ignore:`torch.jit:FutureWarning")  # torch 2.14 deprecates TorchScript
def test_cli_refuses_a_missing_experiment_and_loader_refuses_a_foreign_file(tmp_path, capsys):
    assert main(["export", "--model", str(tmp_path / "nope"), "--format", "onnx", str(tmp_path / "m.onnx")]) == 2
    assert "not an experiment directory" in capsys.readouterr().err
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x08\x07not a model")
    with pytest.raises(ExportError, match="junk.onnx"):
        load_exported(junk)
    plain = tmp_path / "plain.ts"  # a TorchScript file that asrkit did not write: refused before it is loaded
    torch.jit.save(torch.jit.script(torch.nn.Identity()), str(plain))
    with pytest.raises(ExportError, match="plain.ts: a torchscript file without asrkit metadata"):
        load_exported(plain, trust_torchscript=True)
