"""asrkit.data.dataset: construction-time filtering, items, unreadable audio and collate padding."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import soundfile as sf
import torch
from torch.utils.data import DataLoader

from asrkit.data.datadir import DataDir, DataDirError, Segment
from asrkit.data.dataset import AsrDataset, collate
from asrkit.data.sampler import BucketBatchSampler

SR = 16000
ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ "


class CharTokenizer:
    def encode(self, text: str):
        return [3 + ALPHABET.index(c) for c in text]


def wav(tmp_path, name: str, seconds: float, seed: int = 0) -> str:
    x = np.random.default_rng(seed).uniform(-0.5, 0.5, int(seconds * SR)).astype(np.float32)
    path = tmp_path / f"{name}.wav"
    sf.write(path, x, SR, subtype="FLOAT")
    return str(path)


def test_items_and_construction_time_filtering(tmp_path, caplog):
    dd = DataDir(
        wav_scp={"a": wav(tmp_path, "a", 0.5, 1), "b": wav(tmp_path, "b", 1.0, 2), "empty": wav(tmp_path, "e", 0.5),
                 "short": wav(tmp_path, "s", 0.05), "long": wav(tmp_path, "l", 3.0), "gone": str(tmp_path / "no.wav")},
        text={"a": "HI", "b": "HELLO THERE", "empty": "", "short": "X", "long": "LONG", "gone": "G",
              "textonly": "NO AUDIO"},
        path="mydir")
    caplog.set_level(logging.INFO, logger="asrkit.data")
    ds = AsrDataset(dd, SR, CharTokenizer(), min_duration=0.1, max_duration=2.0)
    assert len(ds) == 2 and ds.durations() == [0.5, 1.0]
    assert ds.dropped == {"no audio entry in wav.scp/segments": ["textonly"], "empty or missing transcript": ["empty"],
                          "unreadable audio": ["gone"], "shorter than min_duration 0.1 s": ["short"],
                          "longer than max_duration 2.0 s": ["long"]}
    report = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(report) == 1 and report[0].startswith("mydir: dropped 5 of 7 utterances")
    assert "1 empty or missing transcript (e.g. empty)" in report[0]
    assert any("utt gone:" in r.getMessage() and "file not found" in r.getMessage() for r in caplog.records)

    item = ds[1]
    assert item["utt"] == "b" and item["text"] == "HELLO THERE"
    np.testing.assert_array_equal(item["wav"].numpy(), sf.read(dd.wav_scp["b"], dtype="float32")[0])
    assert item["tokens"].dtype == torch.long and item["tokens"].tolist() == CharTokenizer().encode("HELLO THERE")


def test_segments_and_known_durations_need_no_header_reads(tmp_path):
    path = wav(tmp_path, "rec", 2.0)
    dd = DataDir(wav_scp={"rec": path, "ghost": str(tmp_path / "missing.wav")},
                 segments={"s1": Segment("rec", 0.5, 1.0), "s2": Segment("rec", 1.0, None),
                           "g": Segment("ghost", 0, 1.5)},
                 text={"s1": "A", "s2": "B", "g": "C"})
    ds = AsrDataset(dd, SR, CharTokenizer())
    # sorted ids g, s1, s2; g's duration comes from its segment: its missing audio is only found on load
    assert ds.durations() == [1.5, 0.5, 1.0]
    assert ds[0] is None
    full = sf.read(path, dtype="float32")[0]
    np.testing.assert_array_equal(ds[2]["wav"].numpy(), full[SR:])
    np.testing.assert_array_equal(ds[1]["wav"].numpy(), full[8000:16000])


def test_unreadable_utterance_is_skipped_not_fatal(tmp_path, caplog):
    paths = {u: wav(tmp_path, u, d, i) for i, (u, d) in enumerate([("u1", 0.3), ("u2", 0.5), ("u3", 0.2)])}
    dd = DataDir(wav_scp=paths, text={"u1": "A", "u2": "BB", "u3": "CCC"}, utt2dur={"u1": 0.3, "u2": 0.5, "u3": 0.2})
    ds = AsrDataset(dd, SR, CharTokenizer())
    open(paths["u2"], "wb").write(b"this is not audio at all" * 10)  # corrupted after the dataset was built
    with caplog.at_level(logging.WARNING, logger="asrkit.data"):
        assert ds[1] is None
    assert any(r.name == "asrkit.data" and "utt u2:" in r.getMessage() and "cannot read audio header"
               in r.getMessage() for r in caplog.records)
    batch = collate([ds[i] for i in range(3)])
    assert batch["utts"] == ["u1", "u3"] and batch["num_skipped"] == 1


def test_collate_pads_and_reports_lengths():
    items = [{"utt": "x", "wav": torch.tensor([1.0, 2.0, 3.0]), "tokens": torch.tensor([5, 6]), "text": "X"},
             None,
             {"utt": "y", "wav": torch.tensor([4.0]), "tokens": torch.tensor([7, 8, 9, 10]), "text": "Y"}]
    batch = collate(items)
    torch.testing.assert_close(batch["wav"], torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]]))
    assert batch["wav"].dtype == torch.float32
    assert batch["wav_lens"].tolist() == [3, 1] and batch["wav_lens"].dtype == torch.long
    assert batch["tokens"].tolist() == [[5, 6, -1, -1], [7, 8, 9, 10]]
    assert batch["token_lens"].tolist() == [2, 4] and batch["token_lens"].dtype == torch.long
    assert batch["utts"] == ["x", "y"] and batch["texts"] == ["X", "Y"] and batch["num_skipped"] == 1


def test_collate_of_only_failures_is_an_empty_batch():
    batch = collate([None, None])
    assert batch["wav"].shape == (0, 0) and batch["tokens"].shape == (0, 0)
    assert batch["wav_lens"].shape == (0,) and batch["token_lens"].shape == (0,)
    assert batch["utts"] == [] and batch["num_skipped"] == 2


def test_without_tokenizer_text_is_optional(tmp_path):
    dd = DataDir(wav_scp={"a": wav(tmp_path, "a", 0.2), "b": wav(tmp_path, "b", 0.3)}, text={"a": "HI"})
    ds = AsrDataset(dd, SR)
    assert len(ds) == 2 and ds[1]["text"] == "" and ds[1]["tokens"].shape == (0,)


def test_nothing_left_is_an_error_up_front(tmp_path):
    dd = DataDir(wav_scp={"a": wav(tmp_path, "a", 0.2)}, text={"a": ""}, path="d")
    with pytest.raises(DataDirError, match=r"d: no usable utterance left \(of 1\); dropped: 1 empty"):
        AsrDataset(dd, SR, CharTokenizer())


def test_dataloader_with_bucket_sampler_and_resampling(tmp_path):
    paths = {f"u{i}": wav(tmp_path, f"u{i}", 0.1 * (i + 1), i) for i in range(6)}
    sf.write(tmp_path / "u8k.wav", np.zeros(4000, np.float32), 8000)  # resampled to 16 kHz on load
    paths["u8k"] = str(tmp_path / "u8k.wav")
    dd = DataDir(wav_scp=paths, text={u: "AB" for u in paths})
    ds = AsrDataset(dd, SR, CharTokenizer())
    sampler = BucketBatchSampler(ds.durations(), max_frames=150, max_batch_size=4, seed=3)
    loader = DataLoader(ds, batch_sampler=sampler, collate_fn=collate)
    seen = []
    for batch in loader:
        assert batch["wav"].shape == (len(batch["utts"]), int(batch["wav_lens"].max()))
        seen += batch["utts"]
        if "u8k" in batch["utts"]:
            assert batch["wav_lens"][batch["utts"].index("u8k")] == 8000
    assert sorted(seen) == sorted(paths)
