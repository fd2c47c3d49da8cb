"""asrkit.data.datadir: read/write round trips, utterances, utt2dur, validate, fix, subset, combine."""
from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
import soundfile as sf

from asrkit.data.datadir import (DataDir, DataDirError, Segment, combine_data_dirs, compute_utt2dur, fix_data_dir,
                                 read_data_dir, subset_data_dir, utt2spk_to_spk2utt, validate_data_dir,
                                 write_data_dir)
from asrkit.data.table import TableError

SR = 16000


def fields(dd: DataDir) -> dict:
    return {k: v for k, v in dataclasses.asdict(dd).items() if k != "path"}


def write_files(d, files: dict) -> str:
    os.makedirs(d, exist_ok=True)
    for name, text in files.items():
        (d / name).write_text(text, encoding="utf-8")
    return str(d)


def good_dir(d, n: int = 4) -> str:
    """A valid dir without segments: u1..un, speakers A (odd) and B (even)."""
    utts = [f"u{i}" for i in range(1, n + 1)]
    spk = {u: "A" if i % 2 else "B" for i, u in enumerate(utts, 1)}
    return write_files(d, {
        "wav.scp": "".join(f"{u} /x/{u}.wav\n" for u in utts),
        "text": "".join(f"{u} HELLO {u.upper()}\n" for u in utts),
        "utt2spk": "".join(f"{u} {spk[u]}\n" for u in utts),
        "spk2utt": "A " + " ".join(u for u in utts if spk[u] == "A") + "\nB "
                   + " ".join(u for u in utts if spk[u] == "B") + "\n",
        "utt2dur": "".join(f"{u} 1.5\n" for u in utts),
    })


def test_round_trip_with_segments_unicode_and_byte_order(tmp_path):
    dd = DataDir(
        wav_scp={"recB": "/data/b.flac", "recA": "sox /data/a.wav -t wav - |", "récC": "c.wav"},
        segments={"recA-1": Segment("recA", 0.0, 1.25), "recA-2": Segment("recA", 1.25, None),
                  "_x": Segment("recB", 0.5, 2.0), "Zed": Segment("récC", 0.001234, 9.5)},
        text={"recA-1": "HELLO WORLD", "recA-2": "", "_x": "ÇA VA", "Zed": "Z"},
        utt2spk={"recA-1": "spkA", "recA-2": "spkA", "_x": "spkB", "Zed": "spkA"},
        utt2dur={"recA-1": 1.25, "recA-2": 3.1, "_x": 1.5, "Zed": 9.498766},
    )
    write_data_dir(dd, tmp_path / "d")
    back = read_data_dir(tmp_path / "d")
    assert fields(back) == fields(dd)
    # keys sorted as LC_ALL=C sort does: byte order of the UTF-8 text
    for name in ("wav.scp", "segments", "text", "utt2spk", "utt2dur"):
        keys = [line.split()[0] for line in (tmp_path / "d" / name).read_text(encoding="utf-8").splitlines()]
        assert keys == sorted(keys, key=lambda k: k.encode("utf-8")), name
    assert (tmp_path / "d" / "spk2utt").read_text() == "spkA Zed recA-1 recA-2\nspkB _x\n"
    assert (tmp_path / "d" / "segments").read_text().splitlines()[3] == "recA-2 recA 1.25 -1"
    # a second write of what was read is byte-identical
    write_data_dir(back, tmp_path / "e")
    for name in os.listdir(tmp_path / "d"):
        assert (tmp_path / "d" / name).read_bytes() == (tmp_path / "e" / name).read_bytes()


def test_write_removes_tables_the_data_dir_no_longer_has(tmp_path):
    d = good_dir(tmp_path / "d")
    dd = read_data_dir(d)
    dd.utt2dur = None
    write_data_dir(dd, d)
    assert not os.path.exists(os.path.join(d, "utt2dur"))
    assert read_data_dir(d).utt2dur is None


def test_utterances_records(tmp_path):
    dd = DataDir(wav_scp={"r1": "r1.wav"},
                 segments={"a": Segment("r1", 1.0, 2.5), "b": Segment("r1", 2.5, None), "c": Segment("r9", 0, 1)},
                 text={"a": "A", "b": "B", "c": "C", "d": "D"}, utt2spk={"a": "s", "b": "s", "c": "s", "d": "s"})
    recs = {u.utt: u for u in dd.utterances()}
    assert list(recs) == ["a", "b", "c", "d"]
    assert (recs["a"].source, recs["a"].start, recs["a"].end, recs["a"].duration) == ("r1.wav", 1.0, 2.5, 1.5)
    assert recs["a"].text == "A" and recs["a"].spk == "s"
    assert recs["b"].end is None and recs["b"].duration is None  # unknown without reading audio
    assert recs["c"].source is None  # recording r9 not in wav.scp
    assert recs["d"].source is None  # text only


def test_read_errors_name_file_and_line(tmp_path):
    d = good_dir(tmp_path / "d")
    (tmp_path / "d" / "segments").write_text("u1 r1 0 1\nu2 r1 zero 1\n")
    with pytest.raises(TableError, match=r"segments:2: start/end 'zero 1' are not numbers"):
        read_data_dir(d)
    os.remove(tmp_path / "d" / "segments")
    (tmp_path / "d" / "utt2dur").write_text("u1 1.0\nu2 long\n")
    with pytest.raises(TableError, match=r"utt2dur:2: duration 'long' is not a number"):
        read_data_dir(d)
    os.remove(tmp_path / "d" / "wav.scp")
    with pytest.raises(DataDirError, match=r"wav.scp: missing"):
        read_data_dir(d)


def test_compute_utt2dur_from_headers_and_segments(tmp_path):
    lengths = {"r1": 16000 * 3 + 7, "r2": 8000}
    for rec, n in lengths.items():
        sf.write(tmp_path / f"{rec}.wav", np.zeros(n, np.float32), SR, subtype="PCM_16")
    plain = DataDir(wav_scp={"r1": str(tmp_path / "r1.wav"), "r2": f"cat {tmp_path / 'r2.wav'} |",
                             "r3": str(tmp_path / "nope.wav")})
    durs, errors = compute_utt2dur(plain, jobs=2)
    assert durs == {"r1": lengths["r1"] / SR, "r2": 0.5}
    assert list(errors) == ["r3"] and errors["r3"].startswith("utt r3: ") and "file not found" in errors["r3"]

    seg = DataDir(wav_scp={"r1": str(tmp_path / "r1.wav"), "r3": str(tmp_path / "nope.wav")},
                  segments={"a": Segment("r1", 0.5, 1.0), "b": Segment("r1", 1.0, None), "c": Segment("r3", 0, None),
                            "d": Segment("r3", 1, 2)})
    durs, errors = compute_utt2dur(seg)
    assert durs == pytest.approx({"a": 0.5, "b": lengths["r1"] / SR - 1.0, "d": 1.0})
    assert errors["c"].startswith("utt c: recording r3: ") and "file not found" in errors["c"]


def test_spk2utt_inverts_utt2spk():
    assert utt2spk_to_spk2utt({"b2": "s2", "a1": "s1", "a2": "s2", "c": "s1"}) == {"s1": ["a1", "c"],
                                                                                 "s2": ["a2", "b2"]}


def test_validate_accepts_a_good_dir(tmp_path):
    rep = validate_data_dir(good_dir(tmp_path / "d"))
    assert rep.ok, rep.problems


def _replace(name, old, new):
    def mutate(d):
        p = d / name
        text = p.read_text()
        assert old in text
        p.write_text(text.replace(old, new, 1))
    return mutate


def _append(name, line):
    def mutate(d):
        with open(d / name, "a") as fh:
            fh.write(line)
    return mutate


def _remove(name):
    return lambda d: os.remove(d / name)


def _add_segments(text):
    def mutate(d):
        (d / "segments").write_text(text)
        (d / "wav.scp").write_text("r1 /x/r1.wav\n")
    return mutate


@pytest.mark.parametrize("mutate,expected", [
    (_replace("text", "u1 HELLO U1\nu2 HELLO U2\n", "u2 HELLO U2\nu1 HELLO U1\n"), "text:2: not sorted"),
    (_replace("utt2spk", "u2 B\n", "u2 B\n\n"), "utt2spk:3: empty line"),
    (_replace("text", "u2 HELLO U2\n", "u2 HELLO U2\nu2 AGAIN\n"), "text:3: duplicate key 'u2' (first on line 2)"),
    (_replace("text", "u3 HELLO U3\n", ""), "wav.scp:3: utt 'u3' is not in text"),
    (_append("text", "u9 EXTRA\n"), "wav.scp"),  # u9 is not in wav.scp; checked precisely below
    (_replace("utt2dur", "u2 1.5", "u2 -1"), "utt2dur:2: 'u2': duration -1 is not positive"),
    (_replace("utt2dur", "u2 1.5", "u2 0"), "utt2dur:2: 'u2': duration 0 is not positive"),
    (_replace("spk2utt", "A u1 u3", "A u1"), "utt2spk:3: utt 'u3' is not in spk2utt"),
    (_replace("spk2utt", "B u2 u4", "B u2 u4 u1"), "spk2utt:2: utt 'u1' listed again (first on line 1)"),
    (_replace("spk2utt", "A u1 u3", "A u1 u3 u5"), "spk2utt:1: utt 'u5' is under speaker 'A' but utt2spk says"),
    (_remove("utt2spk"), "utt2spk: missing"),
    (_remove("text"), "text: missing"),
    (_replace("wav.scp", "u2 /x/u2.wav", "u2"), "wav.scp:2: 'u2': no path or command"),
    (_add_segments("u1 r1 0 1\nu2 r2 0 1\nu3 r1 2 1.5\nu4 r1 1 -1\n"),
     "segments:2: recording 'r2' of utt 'u2' has no entry in wav.scp"),
    (_add_segments("u1 r1 0 1\nu2 r1 1 2\nu3 r1 2 1.5\nu4 r1 1 -1\n"), "segments:3: 'u3': start 2.0 >= end 1.5"),
    (_add_segments("u1 r1 0 1\nu2 r1 1 2\nu3 r1 2\nu4 r1 1 -1\n"), "segments:3: 'u3': expected 'utt rec start end'"),
])
def test_validate_finds_each_problem_with_file_and_line(tmp_path, mutate, expected):
    d = good_dir(tmp_path / "d")
    mutate(tmp_path / "d")
    rep = validate_data_dir(d)
    assert not rep.ok
    assert any(expected in p for p in rep.problems), rep.problems


def test_validate_lists_all_problems_at_once(tmp_path):
    d = good_dir(tmp_path / "d")
    _append("text", "u9 EXTRA\n")(tmp_path / "d")
    _replace("utt2dur", "u4 1.5", "u4 -2")(tmp_path / "d")
    _replace("utt2spk", "u2 B\n", "u2 B\n\n")(tmp_path / "d")
    rep = validate_data_dir(d)
    assert f"{d}/text:5: utt 'u9' is not in wav.scp" in rep.problems
    assert any(p.startswith(f"{d}/utt2dur:4:") for p in rep.problems)
    assert any(p.startswith(f"{d}/utt2spk:3: empty line") for p in rep.problems)
    assert validate_data_dir(d, require_text=False).problems != []


def test_validate_empty_transcript_is_a_warning_and_check_audio_opens_files(tmp_path):
    d = tmp_path / "d"
    sf.write(tmp_path / "ok.wav", np.zeros(1600, np.float32), SR)
    (tmp_path / "bad.wav").write_bytes(b"RIFF junk")
    write_files(d, {"wav.scp": f"a {tmp_path}/ok.wav\nb {tmp_path}/bad.wav\n", "text": "a\nb B\n",
                    "utt2spk": "a a\nb b\n", "spk2utt": "a a\nb b\n"})
    rep = validate_data_dir(d)
    assert rep.ok and any("text:1: utt 'a' has an empty transcript" in w for w in rep.warnings)
    rep = validate_data_dir(d, check_audio=True)
    assert len(rep.problems) == 1 and rep.problems[0].startswith(f"{d}/wav.scp:2: utt b: {tmp_path}/bad.wav:")


def test_fix_drops_and_reports_and_keeps_a_backup(tmp_path):
    d = tmp_path / "d"
    write_files(d, {
        "wav.scp": "r1 /x/r1.wav\nr0 /x/r0.wav\nr2 /x/r2.wav\n",  # unsorted; r2 becomes unused
        "segments": "s3 r1 2 3\ns1 r1 0 1\ns2 r1 1 2\ns4 r9 0 1\ns5 r1 3 2.5\ns6 r0 0 -1\ns7 r2 0 1\n",
        "text": "s1 A\ns2 B\n\ns3 C\ns4 D\ns5 E\ns6 F\ns8 H\n",  # empty line; s7 missing; s8 has no segment
        "utt2spk": "s1 x\ns2 y\ns3 x\ns4 x\ns5 x\ns6 x\ns7 x\ns8 x\n",
        "spk2utt": "x s1\n",  # stale: regenerated
        "utt2dur": "s1 1\ns2 -1\ns3 1\ns4 1\ns5 1\ns6 4\ns7 1\ns8 1\n",
    })
    originals = {n: (d / n).read_bytes() for n in os.listdir(d)}
    report = fix_data_dir(d)
    assert report.kept == 3
    assert set(report.dropped) == {"s2", "s4", "s5", "s7", "s8"}
    assert "utt2dur:2: duration -1 is not positive" in report.dropped["s2"]
    assert report.dropped["s4"] == ["segments:4: recording 'r9' not in wav.scp"]
    assert report.dropped["s5"] == ["segments:5: start 3.0 >= end 2.5"]
    assert report.dropped["s7"] == ["not in text"]
    assert report.dropped["s8"] == ["not in segments"]
    assert "dropped 5" in report.summary() and "s4: segments:4" in report.summary()
    assert validate_data_dir(d).ok, validate_data_dir(d).problems
    dd = read_data_dir(d)
    assert sorted(dd.segments) == ["s1", "s3", "s6"] and sorted(dd.wav_scp) == ["r0", "r1"]
    assert (d / "spk2utt").read_text() == "x s1 s3 s6\n"
    assert dd.text == {"s1": "A", "s3": "C", "s6": "F"}
    for name, data in originals.items():
        assert (d / ".backup" / name).read_bytes() == data


def test_fix_drops_segments_of_a_recording_without_a_path(tmp_path):
    d = write_files(tmp_path / "d", {"wav.scp": "r1 /x/r1.wav\nr2\n", "segments": "a r1 0 1\nb r2 0 1\n",
                                     "text": "a A\nb B\n", "utt2spk": "a s\nb s\n"})
    report = fix_data_dir(d)
    assert report.dropped == {"b": ["segments:2: recording 'r2' not in wav.scp"]}
    assert read_data_dir(d).wav_scp == {"r1": "/x/r1.wav"}


def test_fix_refuses_to_empty_a_dir(tmp_path):
    d = write_files(tmp_path / "d", {"wav.scp": "a /x.wav\n", "text": "b B\n"})
    with pytest.raises(DataDirError, match="nothing was changed"):
        fix_data_dir(d)
    assert (tmp_path / "d" / "text").read_text() == "b B\n"


def test_fix_creates_utt2spk_when_missing(tmp_path):
    d = write_files(tmp_path / "d", {"wav.scp": "b /b.wav\na /a.wav\n", "text": "a A\nb B\n"})
    report = fix_data_dir(d)
    assert report.kept == 2 and any("utt2spk was missing" in n for n in report.notes)
    assert validate_data_dir(d).ok


def test_subset_selections(tmp_path):
    dd = read_data_dir(good_dir(tmp_path / "d", n=9))
    assert subset_data_dir(dd, first=3).audio_utts() == ["u1", "u2", "u3"]
    assert subset_data_dir(dd, last=2).audio_utts() == ["u8", "u9"]
    r1 = subset_data_dir(dd, random_n=4, seed=1).audio_utts()
    assert len(r1) == 4 and r1 == subset_data_dir(dd, random_n=4, seed=1).audio_utts()
    assert any(subset_data_dir(dd, random_n=4, seed=s).audio_utts() != r1 for s in range(2, 6))
    sub = subset_data_dir(dd, utt_list=["u5", "u2", "zzz"])
    assert sub.audio_utts() == ["u2", "u5"] and sorted(sub.text) == ["u2", "u5"] and sorted(sub.utt2dur) == ["u2", "u5"]
    assert subset_data_dir(dd, spk_list=["B"]).audio_utts() == ["u2", "u4", "u6", "u8"]
    with pytest.raises(DataDirError, match="exactly one"):
        subset_data_dir(dd, first=1, last=1)
    with pytest.raises(DataDirError, match="asked for 10 utterances but the data dir has 9"):
        subset_data_dir(dd, first=10)


def test_subset_with_segments_keeps_only_used_recordings():
    dd = DataDir(wav_scp={"r1": "1.wav", "r2": "2.wav"},
                 segments={"a": Segment("r1", 0, 1), "b": Segment("r2", 0, 1), "c": Segment("r2", 1, 2)})
    sub = subset_data_dir(dd, utt_list=["b", "c"])
    assert sub.wav_scp == {"r2": "2.wav"} and sorted(sub.segments) == ["b", "c"]


def test_combine(tmp_path):
    a = read_data_dir(good_dir(tmp_path / "a", n=2))
    b_dir = good_dir(tmp_path / "b", n=4)
    os.remove(tmp_path / "b" / "utt2dur")
    b = read_data_dir(b_dir).subset(["u3", "u4"])
    out, notes = combine_data_dirs([("a", a), ("b", b)])
    assert out.audio_utts() == ["u1", "u2", "u3", "u4"]
    assert out.text == {**a.text, **b.text} and out.spk2utt == {"A": ["u1", "u3"], "B": ["u2", "u4"]}
    assert out.utt2dur is None and notes == ["utt2dur left out: missing in b"]
    with pytest.raises(DataDirError, match=r"'u1' is in both a and a2; 'u2' is in both a and a2"):
        combine_data_dirs([("a", a), ("a2", a)])


def test_combine_mixes_segmented_and_plain_dirs():
    seg = DataDir(wav_scp={"r1": "1.wav"}, segments={"s1": Segment("r1", 0, 1)}, text={"s1": "A"})
    plain = DataDir(wav_scp={"p1": "p.wav"}, text={"p1": "B"})
    out, _ = combine_data_dirs([("seg", seg), ("plain", plain)])
    assert out.segments == {"s1": Segment("r1", 0, 1), "p1": Segment("p1", 0.0, None)}
    assert out.wav_scp == {"r1": "1.wav", "p1": "p.wav"}
    clash = DataDir(wav_scp={"r1": "other.wav"}, segments={"s2": Segment("r1", 0, 1)})
    with pytest.raises(DataDirError, match="recording 'r1' is in both seg and clash with different audio"):
        combine_data_dirs([("seg", seg), ("clash", clash)])
