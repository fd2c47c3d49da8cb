"""tools/fingerprint.py: what changes a recipe step's fingerprint, and what does not."""
from __future__ import annotations

import os
from pathlib import Path
from tool_loader import load_tool

REPO = Path(__file__).resolve().parents[2]
fp = load_tool("fingerprint")


def test_inputs_that_change_the_fingerprint_and_those_that_do_not(tmp_path, monkeypatch):
    d = tmp_path / "data"
    (d / ".done").mkdir(parents=True)
    (d / "text").write_text("a b\n")
    f = tmp_path / "conf.yaml"
    f.write_text("x: 1\n")
    base = fp.fingerprint([str(d), str(f), "5000"])
    assert len(base) == 64 and base == fp.fingerprint([str(d), str(f), "5000"])
    assert fp.fingerprint([str(d), str(f), "500"]) != base  # an option
    assert fp.fingerprint([str(f), str(d), "5000"]) != base  # the order of the arguments
    (d / ".done" / "train").write_text("whatever")  # the markers themselves never count
    assert fp.fingerprint([str(d), str(f), "5000"]) == base
    f.write_text("x: 2\n")  # a small file counts by content, whatever its time
    changed = fp.fingerprint([str(d), str(f), "5000"])
    assert changed != base
    f.write_text("x: 1\n")
    os.utime(f, (1, 1))
    assert fp.fingerprint([str(d), str(f), "5000"]) == base
    (d / "sub").mkdir()
    (d / "sub" / "wav.scp").write_text("u x.wav\n")  # a new file in a directory
    grown = fp.fingerprint([str(d), str(f), "5000"])
    assert grown != base
    os.utime(d / "sub" / "wav.scp", (2, 2))  # directories count by size and time
    assert fp.fingerprint([str(d), str(f), "5000"]) != grown
    monkeypatch.setattr(fp, "BIG", 3)  # a big file counts by size and time, not content
    f.write_text("x: 3\n")
    os.utime(f, (7, 7))
    big = fp.fingerprint([str(f)])
    f.write_text("x: 4\n")
    os.utime(f, (7, 7))
    assert fp.fingerprint([str(f)]) == big
    os.utime(f, (8, 8))
    assert fp.fingerprint([str(f)]) != big
    assert fp.main([]) == 2 and fp.main(["--help"]) == 0
