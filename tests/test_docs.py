"""The documentation is tested: every Python and shell example in README.md and docs/ (and in the files the
pages include) runs here or says why not, the site builds with ``mkdocs build --strict``, and the generated
reference lists every config key with its default.

The line before each fenced ``python``/``bash`` block is ``<!-- docs-test: run ... -->`` (run in the quick
start's work dir), ``<!-- docs-test: quickstart -->`` (the block is docs/snippets/quickstart.sh, which
tests/cli/test_quickstart.py runs) or ``<!-- docs-test: skip REASON -->``.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import re
import shlex
import shutil
import subprocess
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import pytest
import soundfile as sf

from asrkit.cli import main as asrkit_main
from tests.cli.test_quickstart import _workdir
from tests.tool_loader import load_tool

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "docs" / "snippets" / "quickstart.sh"
LANGUAGES = {"python": "python", "py": "python", "bash": "shell", "sh": "shell", "shell": "shell",
             "console": "shell"}
FENCE = re.compile(r"^(\s*)```\s*([\w+-]*)")
MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(run|skip|quickstart)\b(.*?)-->\s*$")
SNIPPET = re.compile(r'^\s*--8<--\s+"([^"]+)"\s*$')
# Preambles a run block can name with setup=NAME: the names a snippet takes as given.
SETUPS = {
    "ctc_inputs": "import torch\n"
                  "labels = ['', 'a', 'b', ' ']\n"
                  "log_probs = torch.randn(2, 30, 4).log_softmax(-1)\n"
                  "lengths = torch.tensor([30, 22])\n",
}


@dataclass
class Block:
    path: Path  # the file the block is written in
    line: int  # 1-based line of its opening fence
    kind: str  # python | shell
    code: str  # snippet includes expanded
    marker: Optional[Tuple[str, str]]  # (run | skip | quickstart, the rest of the comment)

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def _expand(lines: List[str]) -> str:
    out = []
    for line in lines:
        m = SNIPPET.match(line)
        out.append((REPO / m.group(1)).read_text(encoding="utf-8").rstrip("\n") if m else line)
    return "\n".join(out) + "\n"


def blocks_of(path: Path) -> List[Block]:
    """The Python and shell blocks of a markdown file, and of the markdown files it includes (``--8<--``)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: List[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        inc = SNIPPET.match(lines[i])
        if inc and inc.group(1).endswith(".md"):
            found += blocks_of(REPO / inc.group(1))
        if not m:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        lang = m.group(2).lower()
        if lang in LANGUAGES:
            prev = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
            mk = MARKER.match(prev)
            indent = len(m.group(1))
            body = [ln[indent:] for ln in lines[i + 1:end]]
            found.append(Block(path, i + 1, LANGUAGES[lang], _expand(body),
                               (mk.group(1), mk.group(2).strip()) if mk else None))
        i = end + 1
    return found


def all_blocks() -> List[Block]:
    pages = [REPO / "README.md"] + sorted((REPO / "docs").rglob("*.md"))
    return [b for p in pages for b in blocks_of(p)]


BLOCKS = all_blocks()


def test_every_example_is_run_or_says_why_not():
    assert len(BLOCKS) >= 20  # README and docs hold this many examples; a collector that finds none fails
    bad = [b.name for b in BLOCKS if b.marker is None or (b.marker[0] == "skip" and not b.marker[1])]
    assert not bad, f"blocks without '<!-- docs-test: run|skip REASON|quickstart -->' before them: {bad}"


def test_the_collector_reads_markers_includes_and_indented_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    (tmp_path / "inc.md").write_text("<!-- docs-test: skip needs a GPU -->\n```bash\nnvidia-smi\n```\n")
    (tmp_path / "cmd.sh").write_text("echo one\necho two\n")
    page = tmp_path / "page.md"
    page.write_text("```python\nprint(1)\n```\n\n<!-- docs-test: run -->\n```bash\n--8<-- \"cmd.sh\"\n```\n"
                    "- item\n\n  <!-- docs-test: quickstart -->\n  ```sh\n  ls\n  ```\n```text\nnot code\n```\n"
                    '--8<-- "inc.md"\n')
    got = [(b.line, b.kind, b.code, b.marker) for b in blocks_of(page)]
    assert got == [(1, "python", "print(1)\n", None), (6, "shell", "echo one\necho two\n", ("run", "")),
                   (12, "shell", "ls\n", ("quickstart", "")), (2, "shell", "nvidia-smi\n", ("skip", "needs a GPU"))]


def test_quickstart_blocks_are_the_snippet_file():
    quick = [b for b in BLOCKS if b.marker and b.marker[0] == "quickstart"]
    assert {b.path.name for b in quick} >= {"README.md", "getting-started.md"}
    for b in quick:
        assert b.code == QUICKSTART.read_text(encoding="utf-8"), f"{b.name} differs from {QUICKSTART}"


def commands(code: str) -> List[str]:
    """The block's command lines: continuations joined, blank and comment lines dropped."""
    joined = code.replace("\\\n", " ")
    return [ln.strip() for ln in joined.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def run_command(line: str, cwd: Path, env: Dict[str, str]) -> None:
    """``asrkit ...`` and ``python tools/X.py ...`` in this process (no interpreter start per command), any
    other line with bash; a non-zero status fails with the command and its stderr."""
    argv = shlex.split(line, comments=True)
    if argv[0] in ("asrkit", "python") and not set(argv) & {"|", ">", "<", ";", "&&", "||"}:
        if argv[0] == "asrkit":
            rc = asrkit_main(argv[1:])
        else:
            assert argv[1].startswith("tools/") and argv[1].endswith(".py"), line
            rc = load_tool(argv[1][len("tools/"):-len(".py")]).main(argv[2:])
        assert rc in (0, None), f"{line}: exit status {rc}"
        return
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", line], cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"{line}: exit status {proc.returncode}\n{proc.stderr[-2000:]}"


def _untrained_exp(wd: Path, config: str, out: str) -> None:
    """An experiment dir of an untrained model with the quick start's tokenizer (the examples load it)."""
    import torch

    from asrkit.checkpoint import save_model_weights
    from asrkit.config import load_config, save_config
    from asrkit.models.registry import build_model
    from asrkit.text.tokenizer import load_tokenizer

    tok = load_tokenizer(wd / "data" / "lang" / "tokenizer.json")
    cfg = load_config(REPO / "conf" / config, ["tokenizer.path=tokenizer.json", "cmvn=null"])
    torch.manual_seed(0)
    exp = wd / out
    exp.mkdir(parents=True)
    save_config(cfg, exp / "config.yaml")
    tok.save(exp / "tokenizer.json")
    save_model_weights(build_model(cfg, tok.vocab_size).eval(), exp / "model.pt")


@pytest.fixture(scope="module")
def quickstart_dir(tmp_path_factory) -> Path:
    """A work dir after the quick start's commands ran in it (tiny data and configs: tests/cli/test_quickstart.py),
    with what the other examples name: tools/, conf/decode_*.yaml, long.flac and an exp/tiny_transformer."""
    wd = tmp_path_factory.mktemp("quickstart")
    _workdir(wd)
    (wd / "tools").symlink_to(REPO / "tools")
    for conf in (REPO / "conf").glob("decode_*.yaml"):
        if not (wd / "conf" / conf.name).exists():
            shutil.copy(conf, wd / "conf" / conf.name)
    t = np.arange(16000) / 16000
    tones = [0.3 * np.sin(2 * np.pi * f * t) for f in (250, 330)]  # two 1-s tones half a second apart
    sf.write(wd / "long.flac", np.concatenate([tones[0], np.zeros(8000), tones[1]]).astype(np.float32), 16000,
             format="FLAC")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(wd)
        for line in commands(QUICKSTART.read_text(encoding="utf-8")):
            run_command(line, wd, _env())
    _untrained_exp(wd, "tiny_transformer.yaml", "exp/tiny_transformer")
    return wd


def _env() -> Dict[str, str]:
    import os

    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # asrkit and python of this venv
    env["OMP_NUM_THREADS"] = "1"
    return env


RUN = [b for b in BLOCKS if b.marker and b.marker[0] == "run"]


@pytest.mark.parametrize("block", RUN, ids=[b.name for b in RUN])
def test_example_runs(block: Block, quickstart_dir, monkeypatch, capsys):
    if "train-ngram" in block.code and shutil.which("lmplz") is None and \
            not (REPO / "tools" / "kenlm" / "bin" / "lmplz").exists():
        pytest.skip("KenLM's lmplz is not built (tools/install/install_kenlm.sh)")
    monkeypatch.chdir(quickstart_dir)
    if block.kind == "python":
        setup = re.search(r"setup=(\w+)", block.marker[1])
        code = (SETUPS[setup.group(1)] if setup else "") + block.code
        exec(compile(code, block.name, "exec"), {"__name__": "__docs__"})
    else:
        for line in commands(block.code):
            run_command(line, quickstart_dir, _env())


def test_run_block_failures_are_reported(quickstart_dir, monkeypatch):
    monkeypatch.chdir(quickstart_dir)
    with pytest.raises(AssertionError, match="no_such_file"):
        run_command("python tools/validate_data_dir.py no_such_file", quickstart_dir, _env())
    with pytest.raises(AssertionError, match="exit status 1"):
        run_command("false", quickstart_dir, _env())


# ---- the generated reference -------------------------------------------------------------------------------

def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _keys(cls: type, prefix: str = "") -> List[Tuple[str, type, dataclasses.Field]]:
    """Every leaf key of a config dataclass (each kind of a ``kind`` section), walked independently of the hook."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, key = hints[f.name], f"{prefix}{f.name}"
        kinds = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)]
        if dataclasses.is_dataclass(tp):
            out += _keys(tp, key + ".")
        elif kinds and len(kinds) == len(typing.get_args(tp)):
            for k in kinds:
                out += _keys(k, key + ".")
        else:
            out.append((key, cls, f))
    return out


def test_config_reference_lists_every_key_with_its_default():
    from asrkit.config import DecodeConfig, ExperimentConfig, LMExperimentConfig

    hooks = _hooks()
    text = hooks.config_reference()
    rows = {}
    for line in text.splitlines():
        m = re.match(r"\| `([\w.]+)` \| (.*?) \| `(.*?)` \|", line)
        if m:
            rows.setdefault(m.group(1), []).append((m.group(2), m.group(3)))
    for root in (ExperimentConfig, DecodeConfig, LMExperimentConfig):
        for key, cls, f in _keys(root):
            assert key in rows, f"{root.__name__}: {key} missing from the config reference"
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            shown = [d for _, d in rows[key]]
            if isinstance(default, (tuple, list)):
                expected = "[" + ", ".join(map(str, default)) + "]"
            else:  # `is`, not a dict lookup: 0 == False and 1 == True
                expected = next((y for v, y in ((None, "null"), (True, "true"), (False, "false")) if default is v),
                                str(default))
            assert any(s == expected or (isinstance(default, float) and float(s) == default) for s in shown), \
                f"{key}: default {default!r} not in {shown}"
    # a comment above a field and one at the end of its line both reach the table
    assert "SortaGrad: the first N training epochs" in text and "samples (25 ms at 16 kHz)" in text


@dataclass(frozen=True)
class _Toy:
    """A toy section."""
    plain: int = 3
    # above the field
    commented: Optional[float] = None  # and at its end
    items: Tuple[int, ...] = (1, 2)
    names: List[str] = field(default_factory=lambda: ["a|b"])


def test_config_tables_list_undocumented_fields_and_read_comments():
    text = _hooks().config_tables(_Toy, "Toy.")
    assert "| `plain` | int | `3` |  |" in text
    assert "| `commented` | float \\| null | `null` | above the field and at its end |" in text
    assert "| `items` | list of int | `[1, 2]` |  |" in text
    assert "| `names` | list of str | `[a\\|b]` |  |" in text


def test_cli_reference_holds_each_subcommands_help():
    from asrkit.cli import SUBCOMMANDS

    text = _hooks().cli_reference(["score"])
    assert text.startswith("## asrkit score\n") and "usage: asrkit score" in text and "--utt2spk" in text
    assert set(SUBCOMMANDS) >= {"train", "decode", "transcribe", "score"}


def test_sphinx_roles_render_as_code():
    html = "see :class:<code>~asrkit.pipeline.Transcriber</code> and :func:<code>decode_ctc</code>, not a:<code>b</code>"
    assert _hooks().sphinx_roles_as_code(html) == \
        "see <code>Transcriber</code> and <code>decode_ctc</code>, not a:<code>b</code>"


def test_readme_links_become_site_links():
    hooks = _hooks()
    assert hooks.readme_as_home("see [Data](docs/data.md#x) and [x](https://e.org/docs/y)") == \
        "see [Data](data.md#x) and [x](https://e.org/docs/y)"


# ---- the site ----------------------------------------------------------------------------------------------

def test_the_docs_build_strictly(tmp_path):
    """``mkdocs build --strict`` (what ``make docs`` runs): a broken link or anchor, a page left out of the
    navigation or a docstring mkdocstrings cannot read fails here."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**_env(), "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "WARNING" not in proc.stderr, proc.stderr[-4000:]
    site = tmp_path / "site"
    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("index.html"))
    assert len(pages) >= 18, pages
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "Quick start" in home and 'href="getting-started/' in home  # README.md, links made site links
    config = (site / "reference" / "config" / "index.html").read_text(encoding="utf-8")
    assert "model.encoder.conv_kernel" in config and "lm_unk_offset" in config
    api = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    assert "load_model" in api and "decode_ctc" in api
