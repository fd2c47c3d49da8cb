"""Training and decoding on a CUDA device: the same code as on the CPU, checked against the CPU.

* fp32 training on CUDA follows the CPU run's losses step by step (cuDNN convolutions may use TF32);
* fp16 (with the gradient scaler, whose skipped updates are reported) and bf16 autocast on CUDA learn;
* a joint CTC/attention model overfitted on CUDA transcribes alike on CUDA and on the CPU in every search mode,
  the CTC prefix search with a word n-gram LM included.

Skipped without a CUDA device (the development machines have none; the device checks run them).
"""
from __future__ import annotations

import copy
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from asrkit.config import DecodeConfig, load_config
from asrkit.data.dataset import AsrDataset, collate
from asrkit.data.table import write_table
from asrkit.models.registry import build_model
from asrkit.pipeline import Transcriber
from asrkit.text.tokenizer import CharTokenizer
from asrkit.train.steplog import read_step_log
from asrkit.train.trainer import train
from trainkit import EXACT, tiny_config

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

GPU = "cuda"
REPO = Path(__file__).resolve().parents[2]
WORD_LM = REPO / "tests" / "lm" / "fixtures" / "words_3gram.arpa"
SR = 16000
TEXTS = ["THE CAT SAT", "A DOG SAT ON THE MAT", "THE DOG", "ON THE MAT", "A CAT", "THE CAT SAT ON A DOG"]
LETTERS = sorted(set("".join(TEXTS).replace(" ", "")))


def tone_speech(text: str, rng: np.random.Generator) -> np.ndarray:
    """Each letter a 0.1 s tone of its own pitch, each space 0.08 s of quiet, light noise throughout."""
    parts = [np.zeros(int(0.1 * SR))]
    for ch in text:
        n = int((0.08 if ch == " " else 0.1) * SR)
        t = np.arange(n) / SR
        parts.append(np.zeros(n) if ch == " " else 0.3 * np.sin(2 * np.pi * (250.0 + 90 * LETTERS.index(ch)) * t))
    parts.append(np.zeros(int(0.1 * SR)))
    x = np.concatenate(parts)
    return (x + 0.01 * rng.standard_normal(x.size)).astype(np.float32)


@pytest.fixture(scope="module")
def tone_corpus(tmp_path_factory):
    import soundfile as sf

    rng = np.random.default_rng(0)
    tmp_path = tmp_path_factory.mktemp("tones")
    root = tmp_path / "data"
    root.mkdir()
    wav_scp, text = {}, {}
    for i, sentence in enumerate(TEXTS):
        path = root / f"utt{i}.wav"
        sf.write(path, tone_speech(sentence, rng), SR, subtype="FLOAT")
        wav_scp[f"utt{i}"], text[f"utt{i}"] = str(path), sentence
    write_table(root / "wav.scp", wav_scp)
    write_table(root / "text", text)
    tok = tmp_path / "tokenizer.json"
    CharTokenizer.train(TEXTS).save(tok)
    return {"train": root, "tokenizer": tok}


def _run(corpus, exp: Path, device: str, extra=()) -> list:
    cfg = tiny_config(list(extra))
    train(cfg, str(exp), str(corpus["train"]), None, str(corpus["tokenizer"]), device=device)
    return [r["loss"] for r in read_step_log(str(exp / "steps.tsv"))]


def test_fp32_training_on_cuda_follows_the_cpu(tone_corpus, tmp_path):
    extra = EXACT + ["train.epochs=2", "data.max_batch_size=3"]
    cpu = _run(tone_corpus, tmp_path / "cpu", "cpu", extra)
    gpu = _run(tone_corpus, tmp_path / "gpu", GPU, extra)
    assert len(gpu) == len(cpu) >= 4
    assert gpu == pytest.approx(cpu, rel=5e-3)


@pytest.mark.parametrize("amp", ["fp16", "bf16"])
def test_autocast_on_cuda_learns(tone_corpus, tmp_path, amp):
    extra = ["train.epochs=30", "data.max_batch_size=3", "specaug.enabled=false", "train.warmup_steps=4"]
    fp32 = _run(tone_corpus, tmp_path / "fp32", GPU, extra)
    mixed = _run(tone_corpus, tmp_path / amp, GPU, extra + [f"train.amp={amp}"])
    assert all(np.isfinite(mixed))
    assert np.mean(mixed[-4:]) < 0.5 * np.mean(mixed[:4]), mixed
    log = (tmp_path / amp / "train.log").read_text()
    if amp == "bf16":  # the same first batch and weights as fp32
        assert mixed[0] != fp32[0] and mixed[0] == pytest.approx(fp32[0], rel=0.05)  # autocast is on, and sane
        assert "overflows" not in log
    else:  # the scaler starts at 2**16: the first updates overflow and are skipped, counted apart
        assert re.search(r"epoch 0: .*, 0 non-finite updates skipped, [1-9]\d* fp16 overflows skipped", log), log
        assert len(mixed) < len(fp32)


def _joint_config():
    return load_config(REPO / "conf" / "tiny_transformer.yaml", [
        "specaug.enabled=false", "model.encoder.dropout=0.0", "model.encoder.d_model=64", "model.encoder.num_layers=2",
        "model.encoder.ffn_dim=128", "model.lsm_weight=0.0", "frontend.n_mels=40", "tokenizer.path=tokenizer.json",
        "cmvn=null", "model.decoder.dropout=0.0", "model.decoder.num_layers=1", "model.decoder.ffn_dim=128",
        "model.ctc_weight=0.5"])


def _texts(model, cfg, tok, device: str, wavs, decode: DecodeConfig) -> list:
    tr = Transcriber(copy.deepcopy(model).to(device), cfg, tok, device=device, decode=decode)
    return [(h[0].text, h[0].score) for h in tr.transcribe_nbest(wavs)]


@pytest.fixture(scope="module")
def overfitted(tone_corpus):
    """(model on the CPU, cfg, tokenizer, waveforms): a joint CTC/attention model overfitted on CUDA."""
    torch.manual_seed(0)
    cfg = _joint_config()
    tok = CharTokenizer.train(TEXTS)
    ds = AsrDataset(tone_corpus["train"], SR, tokenizer=tok)
    batch = {k: v.to(GPU) if torch.is_tensor(v) else v for k, v in collate([ds[i] for i in range(len(ds))]).items()}
    model = build_model(cfg, tok.vocab_size).to(GPU)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(400):
        loss = model(batch)["loss"]
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
    wavs = [batch["wav"][i, : int(n)].cpu() for i, n in enumerate(batch["wav_lens"])]
    return model.eval().cpu(), cfg, tok, wavs


@pytest.mark.parametrize("mode,lm", [("greedy", None), ("ctc_prefix", None), ("ctc_prefix", WORD_LM),
                                     ("attention", None), ("joint", None), ("rescore", None)])
def test_a_model_trained_on_cuda_transcribes_alike_on_cuda_and_cpu(overfitted, mode, lm):
    model, cfg, tok, wavs = overfitted
    decode = DecodeConfig(mode=mode, beam=4, lm=str(lm) if lm else None, lm_units="word", lm_weight=0.5)
    cpu = _texts(model, cfg, tok, "cpu", wavs, decode)
    gpu = _texts(model, cfg, tok, GPU, wavs, decode)
    assert [t for t, _ in cpu] == TEXTS  # overfitted: every search reads the training texts
    assert [t for t, _ in gpu] == [t for t, _ in cpu]
    assert [s for _, s in gpu] == pytest.approx([s for _, s in cpu], abs=2e-3, rel=1e-4)
