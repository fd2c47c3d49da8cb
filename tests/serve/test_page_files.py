"""The browser page's files (asrkit/serve/static): shipped in the package (setup.py's package_data, as a wheel
would hold them), found from the installed package, self-contained (no CDN: every URL is one of its own files) and
consistent (every element app.js looks up is in index.html)."""
from __future__ import annotations

import importlib.resources
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STATIC = REPO / "asrkit" / "serve" / "static"
PAGE_FILES = {"index.html", "app.js", "worklet.js", "style.css"}


def test_the_page_files_ship_in_the_package(tmp_path):
    """setup.py's build_py (what a wheel is made of) copies every file of static/."""
    subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path)], cwd=REPO,
                   check=True, capture_output=True)
    built = tmp_path / "asrkit" / "serve" / "static"
    assert {p.name for p in built.iterdir()} == {p.name for p in STATIC.iterdir()} >= PAGE_FILES
    for name in PAGE_FILES:
        assert (built / name).read_bytes() == (STATIC / name).read_bytes()


def test_the_installed_package_finds_its_page():
    static = importlib.resources.files("asrkit.serve").joinpath("static")
    assert {name for name in PAGE_FILES if static.joinpath(name).is_file()} == PAGE_FILES


def test_every_url_of_the_page_is_one_of_its_files():
    html = (STATIC / "index.html").read_text()
    refs = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert refs and all(ref.startswith("static/") and (STATIC / ref[len("static/"):]).is_file() for ref in refs)
    app = (STATIC / "app.js").read_text()
    assert 'addModule("static/worklet.js")' in app
    for name in PAGE_FILES:  # nothing fetched from elsewhere
        assert not re.search(r"https?://\w", (STATIC / name).read_text()), name


def test_every_element_the_script_uses_is_on_the_page():
    html = (STATIC / "index.html").read_text()
    ids = set(re.findall(r'\bid="([^"]+)"', html))
    used = set(re.findall(r'\$\("([^"]+)"\)', (STATIC / "app.js").read_text()))
    assert used and used <= ids, used - ids
    # the transcript is announced to screen readers; the page scales to a phone's width
    assert re.search(r'<div id="transcript"[^>]*aria-live="polite"', html)
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in html
