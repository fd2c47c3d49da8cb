"""recipes/librispeech/local/data_prep.py on a fake LibriSpeech tree."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import soundfile as sf

from asrkit.data.datadir import read_data_dir, validate_data_dir

REPO = Path(__file__).resolve().parents[2]
PREP = REPO / "recipes" / "librispeech" / "local" / "data_prep.py"


def _fake_subset(root: Path) -> Path:
    subset = root / "LibriSpeech" / "dev-clean"
    rng = np.random.default_rng(0)
    for spk, chapter, utts in (("84", "121123", ["HELLO WORLD", "GOOD MORNING"]), ("1272", "128104", ["YES"])):
        d = subset / spk / chapter
        d.mkdir(parents=True)
        lines = []
        for i, words in enumerate(utts):
            utt = f"{spk}-{chapter}-{i:04d}"
            sf.write(d / f"{utt}.flac", rng.standard_normal(1600).astype(np.float32) * 0.1, 16000)
            lines.append(f"{utt} {words}\n")
        lines.append(f"{spk}-{chapter}-9999 NO AUDIO\n")  # transcript line without a FLAC
        (d / f"{spk}-{chapter}.trans.txt").write_text("".join(lines))
    return subset


def test_data_prep_builds_a_valid_kaldi_dir(tmp_path):
    subset = _fake_subset(tmp_path)
    out = tmp_path / "data" / "dev_clean"
    res = subprocess.run([sys.executable, str(PREP), str(subset), str(out)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "2 utterances without audio left out" in res.stderr
    dd = read_data_dir(out)
    assert sorted(dd.text) == ["1272-128104-0000", "84-121123-0000", "84-121123-0001"]
    assert dd.text["84-121123-0001"] == "GOOD MORNING"
    assert dd.utt2spk["84-121123-0000"] == "84"
    assert all(Path(p).is_file() for p in dd.wav_scp.values())
    report = validate_data_dir(out, check_audio=True)
    assert report.ok, report.problems


def test_data_prep_missing_subset_is_a_clear_error(tmp_path):
    res = subprocess.run([sys.executable, str(PREP), str(tmp_path / "nope"), str(tmp_path / "out")],
                         capture_output=True, text=True)
    assert res.returncode == 1 and "nope: no such LibriSpeech subset directory" in res.stderr
