"""MkDocs hooks: the pages generated from the code when the site is built.

- the home page is README.md, its links into docs/ made relative to the site;
- ``<!-- generated: config-reference -->`` becomes the tables of every config key (the dataclasses in
  asrkit/config.py: key, type, default, and the comment or docstring the code gives the key);
- ``<!-- generated: cli-reference -->`` becomes each subcommand's ``--help``.

Generated at build time, so the reference cannot drift from the code. tests/test_docs.py imports this file.
"""
from __future__ import annotations

import contextlib
import functools
import dataclasses
import inspect
import io
import os
import re
import textwrap
import tokenize
import types
import typing
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]
CONFIG_MARK = "<!-- generated: config-reference -->"
CLI_MARK = "<!-- generated: cli-reference -->"


# ---- the configuration reference ---------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def field_comments(cls: type) -> Dict[str, str]:
    """Field name -> its comment in the class body: the comment lines right above the field joined with the
    comment at the end of its line. Fields without either are absent (the caller lists them all the same)."""
    source = textwrap.dedent(inspect.getsource(cls))
    comments: Dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = source.splitlines()
    out: Dict[str, str] = {}
    for lineno, line in enumerate(lines, 1):
        match = re.match(r"\s+(\w+)\s*:", line)
        if match is None or match.group(1) not in {f.name for f in dataclasses.fields(cls)}:
            continue
        above: List[str] = []
        k = lineno - 1
        while k >= 1 and lines[k - 1].strip().startswith("#"):
            above.insert(0, comments[k])
            k -= 1
        parts = above + ([comments[lineno]] if lineno in comments else [])
        if parts:
            out[match.group(1)] = " ".join(parts)
    return out


def _comment_of(cls: type, name: str) -> str:
    """The comment of field ``name``, from the class in ``cls``'s MRO that defines it."""
    for base in cls.__mro__:
        if dataclasses.is_dataclass(base) and name in base.__dict__.get("__annotations__", {}):
            return field_comments(base).get(name, "")
    return ""


def type_name(tp: Any) -> str:
    """A field type as a config file's reader sees it: ``float | null``, ``list of int``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union or origin is types.UnionType:
        names = [type_name(a) for a in args if a is not type(None)]
        return " | ".join(names) + (" | null" if type(None) in args else "")
    if origin in (tuple, list):
        return f"list of {type_name(args[0])}" if args else "list"
    if origin is dict:
        return "mapping"
    if dataclasses.is_dataclass(tp):
        return "section"
    return getattr(tp, "__name__", str(tp))


def default_text(f: dataclasses.Field) -> str:
    """A field's default as it is written in YAML."""
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "(required)"
    if dataclasses.is_dataclass(value):
        return "(section)"
    if isinstance(value, tuple):
        value = list(value)
    import yaml

    return yaml.safe_dump(value, default_flow_style=True, width=1000).strip().removesuffix("\n...").strip()


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _sections(cls: type, path: str) -> Iterator[Tuple[str, type, Optional[str]]]:
    """(key path, dataclass, kind) for ``cls`` and every section below it, depth first; a section that is one
    of several dataclasses (``model.encoder``: chosen by ``kind``) yields each of them."""
    yield path, cls, None
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        sub = f"{path}.{f.name}" if path else f.name
        if dataclasses.is_dataclass(tp):
            yield from _sections(tp, sub)
        elif typing.get_origin(tp) is typing.Union and all(dataclasses.is_dataclass(a) for a in typing.get_args(tp)):
            for choice in typing.get_args(tp):
                for p, c, _ in _sections(choice, sub):
                    yield p, c, dataclasses.fields(choice)[0].default if p == sub else None


def config_tables(root: type, title: str) -> str:
    """The markdown of ``root`` (a config dataclass) and every section below it: one table per section."""
    out = [f"## {root.__name__}", "", title, ""]
    doc = inspect.getdoc(root)
    if doc and not doc.startswith(f"{root.__name__}("):  # dataclasses without a docstring get their signature
        out += [doc, ""]
    for path, cls, kind in _sections(root, ""):
        hints = typing.get_type_hints(cls)
        rows = [f for f in dataclasses.fields(cls) if not dataclasses.is_dataclass(hints[f.name])
                and not _is_kind_union(hints[f.name])]
        if not rows:
            continue
        if path:
            heading = f"`{path}`" + (f" with `kind: {kind}`" if kind else "")
            out += [f"### {heading}", ""]
            doc = inspect.getdoc(cls)
            if doc and not doc.startswith(f"{cls.__name__}("):
                out += [f"`{cls.__name__}`: " + doc.replace("\n\n", "\n"), ""]
        out += ["| key | type | default | description |", "| --- | --- | --- | --- |"]
        for f in rows:
            key = f"{path}.{f.name}" if path else f.name
            out.append(f"| `{key}` | {_cell(type_name(hints[f.name]))} | `{_cell(default_text(f))}` | "
                       f"{_cell(_comment_of(cls, f.name))} |")
        out.append("")
    return "\n".join(out)


def _is_kind_union(tp: Any) -> bool:
    args = typing.get_args(tp)
    return typing.get_origin(tp) is typing.Union and bool(args) and all(dataclasses.is_dataclass(a) for a in args)


def config_reference() -> str:
    """The tables of the three config files asrkit reads."""
    from asrkit.config import DecodeConfig, ExperimentConfig, LMExperimentConfig

    return "\n".join([
        config_tables(ExperimentConfig, "A model config: `conf/*.yaml` (but `decode_*` and `lm_*`), `asrkit train "
                                        "--config`; an experiment dir's `config.yaml`."),
        config_tables(DecodeConfig, "A decoding config: `conf/decode_*.yaml`, `asrkit decode` / `asrkit transcribe "
                                    "--decode-config`, `asrkit.load_model(..., decode=)`; a decode's `decode.yaml`."),
        config_tables(LMExperimentConfig, "A neural LM config: `conf/lm_*.yaml`, `asrkit train-lm --config`; an LM "
                                          "dir's `config.yaml`."),
    ])


# ---- the command-line reference ----------------------------------------------------------------------------

def command_help(name: str) -> str:
    """``asrkit NAME --help`` as the command prints it (80 columns)."""
    from asrkit.cli import main

    buf = io.StringIO()
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
            main([name, "--help"])
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old
    return buf.getvalue()


def cli_reference(names: Optional[Sequence[str]] = None) -> str:
    from asrkit.cli import SUBCOMMANDS

    out: List[str] = []
    for name in names or sorted(SUBCOMMANDS):
        out += [f"## asrkit {name}", "", SUBCOMMANDS[name][1][0].upper() + SUBCOMMANDS[name][1][1:] + ".", "",
                "```text", command_help(name).rstrip(), "```", ""]
    return "\n".join(out)


# ---- the home page -----------------------------------------------------------------------------------------

def readme_as_home(text: str) -> str:
    """README.md with its links into docs/ made relative to the site's root (docs/x.md -> x.md)."""
    return re.sub(r"\]\(docs/", "](", text)


# ---- MkDocs hooks ------------------------------------------------------------------------------------------

def on_files(files, config):
    from mkdocs.structure.files import File

    home = readme_as_home((REPO / "README.md").read_text(encoding="utf-8"))
    files.append(File.generated(config, "index.md", content=home))
    return files


# Docstrings are written with Sphinx roles (:class:`~a.b.C`); rendered as Markdown a role stays as text before
# the code span. The site shows the code span alone, as Sphinx would (``~`` keeps the last name).
ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):<code>(~?)([^<]*)</code>")


def sphinx_roles_as_code(html: str) -> str:
    return ROLE.sub(lambda m: f"<code>{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}</code>", html)


def on_page_content(html: str, page, config, files) -> str:
    return sphinx_roles_as_code(html)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if CONFIG_MARK in markdown:
        markdown = markdown.replace(CONFIG_MARK, config_reference())
    if CLI_MARK in markdown:
        markdown = markdown.replace(CLI_MARK, cli_reference())
    return markdown
