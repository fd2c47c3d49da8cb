"""The walking skeleton end to end on real synthetic speech: tokenizer -> CMVN -> train -> decode -> score."""
from __future__ import annotations

import json

import torch

import asrkit
from asrkit.cli import main
from asrkit.data.table import read_table

TINY = ["model.encoder.d_model=32", "model.encoder.num_heads=2", "model.encoder.ffn_dim=64",
        "model.encoder.num_layers=1", "train.epochs=2", "train.warmup_steps=2", "train.log_interval=1",
        "data.max_batch_size=4", "data.num_workers=0"]


def test_train_decode_score_transcribe(tiny_corpus, tmp_path, capsys):
    data, exp = tiny_corpus, tmp_path / "exp"
    tok, cmvn = tmp_path / "tokenizer.json", tmp_path / "cmvn.json"
    assert main(["train-tokenizer", "--text", str(data / "train" / "text"), str(tok)]) == 0
    assert main(["compute-cmvn", "--no-progress", str(data / "train"), str(cmvn)]) == 0
    args = ["train", "--config", "conf/tiny_ctc.yaml", "--train-data", str(data / "train"), "--valid-data",
            str(data / "dev"), "--out", str(exp), "--tokenizer", str(tok), "--cmvn", str(cmvn)]
    for o in TINY:
        args += ["--set", o]
    assert main(args) == 0
    for name in ("config.yaml", "tokenizer.json", "cmvn.json", "model.pt", "epoch0.pt", "epoch1.pt", "train.log"):
        assert (exp / name).is_file(), name
    assert list((exp / "tensorboard").iterdir())
    assert "valid loss" in (exp / "train.log").read_text()

    dec = exp / "decode_test"
    assert main(["decode", "--model", str(exp), "--data", str(data / "test"), "--out", str(dec)]) == 0
    hyp = read_table(dec / "text")
    assert set(hyp) == set(read_table(data / "test" / "text"))
    capsys.readouterr()
    assert main(["score", "--ref", str(data / "test" / "text"), "--hyp", str(dec / "text"), "--out",
                 str(dec / "scoring")]) == 0
    assert capsys.readouterr().out.startswith("%WER")
    assert (dec / "scoring" / "result.pra").is_file()

    # The experiment dir alone is enough to load the model (moved elsewhere, config paths are relative).
    moved = tmp_path / "moved"
    exp.rename(moved)
    transcriber = asrkit.load_model(str(moved), segmenter="none")
    wav_path = read_table(data / "test" / "wav.scp")[sorted(hyp)[0]]
    assert transcriber.transcribe_files([wav_path])[0].text == hyp[sorted(hyp)[0]]
    capsys.readouterr()
    assert main(["transcribe", "--model", str(moved), "--format", "jsonl", "--segmenter", "none", wav_path]) == 0
    line = json.loads(capsys.readouterr().out.strip())
    assert line["name"] == wav_path and line["text"] == hyp[sorted(hyp)[0]]
    assert " ".join(w["word"] for w in line["words"]) == line["text"]


def test_overfit_four_utterances_until_greedy_ctc_is_exact(tiny_corpus, tmp_path):
    from asrkit.audio.cmvn import CMVNStats
    from asrkit.audio.frontend import build_frontend
    from asrkit.config import load_config
    from asrkit.data.dataset import AsrDataset, collate
    from asrkit.models.registry import build_model
    from asrkit.search.greedy import ctc_greedy_search
    from asrkit.text.tokenizer import CharTokenizer

    torch.manual_seed(0)
    cfg = load_config("conf/tiny_ctc.yaml", ["specaug.enabled=false", "model.encoder.dropout=0.0",
                                             "model.encoder.d_model=64", "model.encoder.num_layers=2",
                                             "model.encoder.ffn_dim=128", "frontend.n_mels=40"])
    texts = read_table(tiny_corpus / "train" / "text")
    tok = CharTokenizer.train(texts.values())
    ds = AsrDataset(tiny_corpus / "train", 16000, tokenizer=tok)
    batch = collate([ds[i] for i in range(4)])
    stats = CMVNStats()
    stats.update(*build_frontend(cfg.frontend)(batch["wav"], batch["wav_lens"]))
    stats.save(tmp_path / "cmvn.json")
    model = build_model(cfg, tok.vocab_size, cmvn_path=str(tmp_path / "cmvn.json"))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(400):
        model.train()
        loss = model(batch)["loss"]
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        if step % 20 == 19:
            model.eval()
            with torch.no_grad():
                enc, lens = model.encode(batch["wav"], batch["wav_lens"])
                ids, n, _ = ctc_greedy_search(model.ctc_log_probs(enc), lens)
            hyps = [tok.decode(row[:k]) for row, k in zip(ids.tolist(), n.tolist())]
            if hyps == batch["texts"]:
                break
    assert hyps == batch["texts"], f"after {step + 1} steps: {hyps} != {batch['texts']}"
