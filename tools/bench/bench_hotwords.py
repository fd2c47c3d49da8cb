#!/usr/bin/env python3
"""Benchmark of hotwords (contextual biasing, issue 31): names the model never heard, and the cost of a long list.

Usage:
    tools/bench/bench_hotwords.py make --work exp/bench_hotwords \
        [--known-text recipes/mini/data/lm/text.txt ...] [--num-utts 120] [--num-names 40] [--seed 0] [--jobs 2]
        [--templates report|tune] [--exclude-names OTHER_WORK/hotwords.txt]
    tools/bench/bench_hotwords.py run --work exp/bench_hotwords --model recipes/mini/exp/small \
        --test recipes/mini/data/test [--decode-config MODEL/tune_dev/decode.yaml] [--hotword-weights 1.5]
        [--class-scores -9 none] [--phrases 1000] [--repeats 2] [--skip-names] [--skip-test] [--markdown FILE]

``make`` writes the names set into WORK: sentences of common words around a name (:data:`TEMPLATES`, every word
of them in the known text) with names (:data:`NAMES`) that no known text holds (default: the demo's LM text,
which holds its training transcripts too), ``--num-names`` names said in ``--num-utts`` utterances, synthesized
by tools/make_synthetic_corpus.py with the demo's training voices (its dev split: training speakers only, 25 dB
SNR as the recipe) into WORK/data/names; WORK/hotwords.txt lists the names said and as many never said
(shuffled); WORK/phrases.txt holds 1000 two-name phrases ("FIRST LAST") of names outside the known text, the
unrelated list for the test set.

``run`` encodes each set once and times the search alone (the part hotwords change) in CPU seconds of this
process (on a shared machine its wall time mostly measures the other jobs), best of ``--repeats``:

1. Names set, the tuned decode config (default MODEL/tune_dev/decode.yaml: CTC prefix search, word LM,
   lexicon) without and with WORK/hotwords.txt, per ``--hotword-weights`` and ``--class-scores``
   (decode.hotword_class_score; ``none``: <unk> + lm_unk_offset); then CTC prefix search without LM, lexicon
   and length bonus, greedy, and, for a model with an attention decoder, joint search (MODEL/tune_dev_joint/decode.yaml
   if it exists). Columns: recall (utterances whose name is in the output), false alarms (utterances with a
   listed name output that was not said), WER of the other words (the reference without its name against the
   output without listed names) and WER.
2. ``--test`` with the first ``--phrases`` phrases of WORK/phrases.txt: WER and search time against no
   hotwords, on the native (C++) loop and the torch loop (``ASRKIT_NATIVE=0``).
Prints markdown tables; a benchmark, not a test. Run it with ``nice`` on a shared machine.
"""
from __future__ import annotations

import argparse
import gzip
import importlib.util
import os
import random
import shutil
import sys
import time
from dataclasses import replace
from types import ModuleType
from typing import Collection, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import torch

_REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, _REPO)

import asrkit  # noqa: E402
from asrkit.config import DecodeConfig, load_decode_config  # noqa: E402
from asrkit.data.datadir import read_data_dir  # noqa: E402
from asrkit.pipeline.searcher import Searcher  # noqa: E402
from asrkit.pipeline.transcriber import pad_waveforms  # noqa: E402
from asrkit.score.wer import score_texts  # noqa: E402

# Surnames from many languages: none occurs in the demo's texts (19th-century English novels); checked again
# against --known-text when the set is made.
NAMES = tuple("""
OKONKWO NAKAMURA KOWALSKI VILLANUEVA ABERNATHY ZELENSKY TANAKA OKAFOR MBEKI SVENSSON LINDQVIST KAPOOR CHOWDHURY
NGUYEN PETROV IVANOVA GONZALEZ FERREIRA OLIVEIRA MORALES ROSSI BIANCHI SCHMIDT WAGNER BECKER HOFFMANN KRUGER
NOVAK HORVATH KOVAC JANSSEN VISSER DEKKER MEIJER BAKKER YAMAMOTO WATANABE KOBAYASHI SUZUKI TAKAHASHI HASHIMOTO
FUJITA OGAWA MATSUMOTO INOUE KIMURA HAYASHI SHIMIZU YAMAZAKI IKEDA ISHIKAWA MAEDA OKADA HASEGAWA KONDO
SAKAMOTO AOKI NISHIMURA FUKUDA MIURA FUJIWARA OKAMOTO MATSUDA NAKAGAWA NAKANO HARADA TAMURA TAKEUCHI KANEKO
NAKAYAMA ISHIDA MORITA SHIBATA YOKOYAMA MIYAZAKI MIYAMOTO UCHIDA TAKAGI TANIGUCHI MARUYAMA TAKADA FUJIMOTO
TAKEDA MURATA SUGIYAMA MASUDA SUGAWARA HIRANO KOJIMA OTSUKA IWASAKI SAKURAI KINOSHITA NOGUCHI NOMURA KIKUCHI
ONISHI SUGIMOTO PATEL SHARMA GUPTA KUMAR REDDY MENON PILLAI BANERJEE MUKHERJEE CHATTERJEE OYELARAN ADEBAYO
OLUWASEUN CHUKWU NWOSU ADEYEMI BABATUNDE MENSAH ASANTE OWUSU BOATENG KIPCHOGE WANJIRU ODHIAMBO MUTUA KAMAU
NJOROGE ACHEBE SOYINKA DLAMINI NKOSI MOKOENA KHUMALO NDLOVU HERNANDEZ RODRIGUEZ MARTINEZ RAMIREZ GUTIERREZ
CHAVEZ MENDOZA CASTILLO JIMENEZ VASQUEZ HERRERA AGUILAR VARGAS GUZMAN FERNANDEZ SALAZAR DELGADO ALVARADO
SANDOVAL CONTRERAS VALENCIA JOVANOVIC PETROVIC NIKOLIC MARKOVIC DJORDJEVIC STOJANOVIC STANKOVIC PAVLOVIC
MILOSEVIC KOWALCZYK WOZNIAK KAMINSKI LEWANDOWSKI ZIELINSKI SZYMANSKI DABROWSKI KOZLOWSKI JANKOWSKI MAZUR
KRAWCZYK PIOTROWSKI GRABOWSKI NOWAKOWSKI PAWLOWSKI MICHALSKI NOWICKI ADAMCZYK
""".split())

# Common words around one name ({}): every word must be in the known text (the LM's words).
TEMPLATES = (
    "I SAW {} AT THE HOUSE THIS MORNING", "{} WILL COME TO DINNER TOMORROW", "PLEASE SEND THE LETTER TO {} TODAY",
    "WE HAVE NOT HEARD FROM {} SINCE LAST WINTER", "THE YOUNG MAN SPOKE TO {} ABOUT THE MONEY",
    "DID YOU TELL {} THAT WE WERE GOING AWAY", "SHE WALKED WITH {} TO THE CHURCH", "MY FRIEND {} IS A VERY GOOD MAN",
    "{} SAID THAT HE WOULD BE HERE SOON", "THEY WENT TO SEE {} IN THE TOWN", "I THINK {} KNOWS THE TRUTH",
    "IT WAS {} WHO FOUND THE KEY", "HAVE YOU MET MISTER {} BEFORE", "GIVE MY LOVE TO {} AND HER SISTER",
    "{} HAS BEEN VERY KIND TO US", "WE SHALL WAIT FOR {} IN THE GARDEN", "THE LETTER FROM {} CAME THIS MORNING",
    "ASK {} WHAT TIME IT IS", "{} AND I WERE OLD FRIENDS", "NOBODY HAD SEEN {} FOR MANY YEARS",
)
# Other sentences for a second names set to tune on (``make --templates tune``), so that what is reported on
# the first was not chosen on its sentences.
TUNE_TEMPLATES = (
    "WHERE IS {} NOW", "I WROTE TO {} LAST NIGHT", "{} WAS STANDING BY THE DOOR", "WE MUST FIND {} BEFORE DARK",
    "THE CHILDREN LIKE {} VERY MUCH", "{} CAME BACK FROM THE CITY", "HE GAVE THE BOOK TO {}",
    "DO YOU KNOW WHERE {} LIVES", "{} OPENED THE WINDOW AND LOOKED OUT", "I HEARD {} SINGING IN THE NEXT ROOM",
    "SHE HAS A LETTER FOR {}", "{} TOOK THE EARLY TRAIN", "LET US CALL ON {} ON SUNDAY",
    "THE OLD WOMAN THANKED {} FOR THE FLOWERS", "{} IS WAITING FOR YOU OUTSIDE", "YOU SHOULD ASK {} FOR HELP",
    "THE HORSE BELONGS TO {}", "{} LAUGHED AT THE STORY", "WE DINED WITH {} ON FRIDAY", "NOBODY BELIEVED {} AT FIRST",
)
TEMPLATE_SETS = {"report": TEMPLATES, "tune": TUNE_TEMPLATES}


def read_words(paths: Iterable[str]) -> Set[str]:
    """Every word of the text files (plain or .gz; one sentence a line)."""
    words: Set[str] = set()
    for path in paths:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as fh:
            for line in fh:
                words.update(line.split())
    return words


def plan_names_set(known: Set[str], num_utts: int, num_names: int, seed: int, templates: Sequence[str] = TEMPLATES,
                   exclude: Collection[str] = ()) -> Tuple[List[str], List[str], List[str], List[str]]:
    """(sentences, names said, names never said, 1000 two-name phrases) from :data:`NAMES` outside ``known`` and
    ``exclude`` (another set's names); each name said in ``num_utts / num_names`` (rounded up) utterances of
    distinct ``templates``."""
    missing = sorted({w for t in templates for w in t.split() if w != "{}"} - known)
    if missing:
        raise ValueError(f"template words not in the known text: {', '.join(missing)}")
    names = [n for n in NAMES if n not in known and n not in exclude]
    if num_names < 1 or num_utts < num_names:
        raise ValueError(f"--num-utts {num_utts} must be at least --num-names {num_names} (>= 1)")
    if 2 * num_names > len(names):
        raise ValueError(f"--num-names {num_names}: only {len(names)} names are outside the known text and the "
                         f"excluded names, and the list needs twice as many")
    per_name = -(-num_utts // num_names)
    if per_name > len(templates):
        raise ValueError(f"{per_name} utterances per name, but only {len(templates)} templates")
    rng = random.Random(seed)
    rng.shuffle(names)
    said, unsaid = names[:num_names], names[num_names:2 * num_names]
    sentences = []
    for k in range(num_utts):
        name = said[k % num_names]
        template = templates[(k // num_names + 7 * (k % num_names)) % len(templates)]
        sentences.append(template.format(name))
    pairs = [(a, b) for a in names for b in names if a != b]
    rng.shuffle(pairs)
    return sentences, said, unsaid, [f"{a} {b}" for a, b in pairs[:1000]]


def make(args: argparse.Namespace) -> int:
    known = read_words(args.known_text)
    exclude = set().union(*(_read_lines(path) for path in args.exclude_names))
    sentences, said, unsaid, phrases = plan_names_set(known, args.num_utts, args.num_names, args.seed,
                                                      TEMPLATE_SETS[args.templates], exclude)
    os.makedirs(args.work, exist_ok=True)
    listed = said + unsaid
    random.Random(args.seed + 1).shuffle(listed)
    _write_lines(os.path.join(args.work, "hotwords.txt"), listed)
    _write_lines(os.path.join(args.work, "said.txt"), said)
    _write_lines(os.path.join(args.work, "phrases.txt"), phrases)
    _write_lines(os.path.join(args.work, "sentences.txt"), sentences)
    synth = os.path.join(args.work, "synth")
    _synthesis_tool().make_corpus(synth, 0, len(sentences), 0, seed=args.seed, snr_db=25.0, jobs=args.jobs,
                audio_dir=os.path.join(args.work, "audio"),
                sentences_path=os.path.join(args.work, "sentences.txt"), progress=False)
    target = os.path.join(args.work, "data", "names")
    if os.path.isdir(target):
        shutil.rmtree(target)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.replace(os.path.join(synth, "dev"), target)  # dev: the training speakers only
    shutil.rmtree(synth)
    print(f"{target}: {len(sentences)} utterances, {len(said)} names said, {len(listed)} listed; "
          f"{len(phrases)} phrases in {args.work}/phrases.txt")
    return 0


def _synthesis_tool() -> ModuleType:
    """tools/make_synthetic_corpus.py by path (tools/ on sys.path would shadow packages: tools/kenlm)."""
    spec = importlib.util.spec_from_file_location("make_synthetic_corpus",
                                                  os.path.join(_REPO, "tools", "make_synthetic_corpus.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _write_lines(path: str, lines: Sequence[str]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("".join(f"{line}\n" for line in lines))


def _read_lines(path: str) -> List[str]:
    with open(path, encoding="utf-8") as fh:
        return [line.strip() for line in fh if line.strip()]


# ---------------------------------------------------------------------------------------------------- run
class Encoded:
    """A data dir's encoder outputs (kept), its references and a search timer."""

    def __init__(self, transcriber, data_dir: str, batch_size: int) -> None:
        self.model, self.tokenizer = transcriber.model, transcriber.tokenizer
        self.refs = dict(read_data_dir(data_dir).text)
        self.batches = []
        with torch.inference_mode():
            for names, wavs in transcriber.data_dir_batches(data_dir, batch_size, {}):
                wav, lens = pad_waveforms(wavs)
                self.batches.append((names, *self.model.encode(wav, lens)))

    def search(self, searcher: Searcher) -> Tuple[Dict[str, str], float]:
        """{utt: text} and the CPU seconds the searches took (every thread of the process)."""
        hyps, seconds = {}, 0.0
        with torch.inference_mode():
            for names, enc, enc_lens in self.batches:
                start = time.process_time()
                found = searcher.search(self.model, enc, enc_lens).best()
                seconds += time.process_time() - start
                hyps.update({n: self.tokenizer.decode(h.tokens) for n, h in zip(names, found)})
        return hyps, seconds


def name_metrics(refs: Dict[str, str], hyps: Dict[str, str], listed: Set[str]) -> Tuple[float, float, float, float]:
    """(recall, false alarms, other-word WER, WER), fractions: the utterances whose name (the listed word of the
    reference) is in the output; those with a listed word output that was not said; the WER of the references
    without their name against the outputs without listed words; the WER."""
    hits = alarms = 0
    others_ref, others_hyp = {}, {}
    for utt, ref in refs.items():
        said = {w for w in ref.split() if w in listed}
        out = hyps.get(utt, "").split()
        hits += bool(said) and said <= set(out)
        alarms += any(w in listed and w not in said for w in out)
        others_ref[utt] = " ".join(w for w in ref.split() if w not in listed)
        others_hyp[utt] = " ".join(w for w in out if w not in listed)
    n = len(refs)
    return hits / n, alarms / n, score_texts(others_ref, others_hyp).wer, score_texts(refs, hyps).wer


def _class_score(text: str) -> Optional[float]:
    return None if text.lower() == "none" else float(text)


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    config = args.decode_config or os.path.join(args.model, "tune_dev", "decode.yaml")
    tuned = load_decode_config(config, list(args.set))
    transcriber = asrkit.load_model(args.model, decode=tuned)
    model, tokenizer, device = transcriber.model, transcriber.tokenizer, transcriber.device
    searchers: Dict[DecodeConfig, Searcher] = {}

    def searcher(cfg: DecodeConfig, hotwords: Optional[List[str]] = None) -> Searcher:
        if cfg not in searchers:
            searchers[cfg] = Searcher(cfg, model, tokenizer, device)
        return searchers[cfg] if hotwords is None else searchers[cfg].with_hotwords(hotwords)

    print(f"model {args.model}; decode config {config} (beam {tuned.beam}, lm_weight {tuned.lm_weight}, "
          f"length_bonus {tuned.length_bonus}, lm_unk_offset {tuned.lm_unk_offset}); {args.threads} thread(s); "
          f"search CPU seconds: one run (names set), the best of {args.repeats} (test set)\n")
    if not args.skip_names:
        listed = _read_lines(os.path.join(args.work, "hotwords.txt"))
        names = Encoded(transcriber, os.path.join(args.work, "data", "names"), tuned.batch_size)
        settings = []
        for weight in args.hotword_weights:
            for score in args.class_scores:
                settings.append((f"word LM + lexicon, weight {weight:g}, class score {score}",
                                 replace(tuned, hotword_weight=weight, hotword_class_score=_class_score(score)), True))
        # no LM: the tuned length bonus (per word with the word LM) would be one per token here
        plain = replace(tuned, lm=None, lexicon=None, length_bonus=0.0, mode="ctc_prefix")
        settings = [("word LM + lexicon (tuned)", tuned, False)] + settings + [
            ("greedy", DecodeConfig(), False), ("CTC prefix, no LM", plain, False)] + [
            (f"CTC prefix, no LM, weight {w:g}", replace(plain, hotword_weight=w), True) for w in args.hotword_weights]
        if model.decoder is not None:
            joint_path = os.path.join(args.model, "tune_dev_joint", "decode.yaml")
            joint = load_decode_config(joint_path) if os.path.isfile(joint_path) else replace(tuned, mode="joint")
            settings += [("joint", joint, False)] + [(f"joint, weight {w:g}", replace(joint, hotword_weight=w), True)
                                                     for w in args.hotword_weights]
        lines = [f"names set: {len(names.refs)} utterances, {len(listed)} listed names "
                 f"({len(_read_lines(os.path.join(args.work, 'said.txt')))} said)", "",
                 "| search | hotwords | recall % | false alarms % | other-word WER % | WER % | search CPU s |",
                 "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
        print("\n".join(lines), flush=True)
        for title, cfg, biased in settings:
            found = names.search(searcher(cfg, listed if biased else None))
            recall, alarms, others, wer = name_metrics(names.refs, found[0], set(listed))
            lines.append(f"| {title} | {len(listed) if biased else 'none'} | {100 * recall:.1f} | "
                         f"{100 * alarms:.1f} | {100 * others:.2f} | {100 * wer:.2f} | {found[1]:.1f} |")
            print(lines[-1], flush=True)
        _save(args.markdown, lines)
    if not args.skip_test:
        phrases = _read_lines(os.path.join(args.work, "phrases.txt"))[: args.phrases]
        test = Encoded(transcriber, args.test, tuned.batch_size)
        lines = ["", f"test set {args.test}: {len(test.refs)} utterances, {len(phrases)} unrelated phrases", "",
                 "| loop | hotwords | WER % | search CPU s | x no hotwords |", "| --- | --- | ---: | ---: | ---: |"]
        print("\n".join(lines), flush=True)
        runs = {}
        for _ in range(args.repeats):  # interleaved: a busy machine slows both settings alike
            for loop in ("native", "torch"):
                os.environ["ASRKIT_NATIVE"] = "1" if loop == "native" else "0"
                for biased in (False, True):
                    hyps, seconds = test.search(searcher(tuned, phrases if biased else None))
                    best = runs.get((loop, biased), (hyps, float("inf")))[1]
                    runs[(loop, biased)] = (hyps, min(best, seconds))
        for loop in ("native", "torch"):
            base = runs[(loop, False)][1]
            for biased in (False, True):
                hyps, seconds = runs[(loop, biased)]
                lines.append(f"| {loop} | {len(phrases) if biased else 'none'} | "
                             f"{100 * score_texts(test.refs, hyps).wer:.2f} | {seconds:.1f} | {seconds / base:.2f} |")
                print(lines[-1], flush=True)
        _save(args.markdown, lines)
    return 0


def _save(path: Optional[str], lines: List[str]) -> None:
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make", help="write the names set and the lists into --work")
    m.add_argument("--work", required=True)
    m.add_argument("--known-text", nargs="+", default=["recipes/mini/data/lm/text.txt"],
                   help="texts the names must be absent from and the templates' words present in (.gz too)")
    m.add_argument("--num-utts", type=int, default=120)
    m.add_argument("--num-names", type=int, default=40)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--jobs", type=int, default=1)
    m.add_argument("--templates", choices=sorted(TEMPLATE_SETS), default="report",
                   help="the sentences: report (the set the figures are given on) or tune (other sentences)")
    m.add_argument("--exclude-names", nargs="+", default=[], metavar="FILE",
                   help="lists (one name a line: another set's hotwords.txt) whose names this set leaves out")
    r = sub.add_parser("run", help="decode the names set and the test set, print the tables")
    r.add_argument("--work", required=True)
    r.add_argument("--model", required=True, help="the experiment dir (the demo: recipes/mini/exp/small)")
    r.add_argument("--test", help="a Kaldi data dir with text (the demo's test set); needed unless --skip-test")
    r.add_argument("--decode-config", help="the word-LM decode config (default: MODEL/tune_dev/decode.yaml)")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="decode config overrides")
    r.add_argument("--hotword-weights", type=float, nargs="+", default=[DecodeConfig.hotword_weight])
    r.add_argument("--class-scores", nargs="+", default=[str(DecodeConfig.hotword_class_score)],
                   help="decode.hotword_class_score values (none: <unk> + lm_unk_offset; default: the config's)")
    r.add_argument("--phrases", type=int, default=1000)
    r.add_argument("--repeats", type=int, default=2)
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--skip-names", action="store_true")
    r.add_argument("--skip-test", action="store_true")
    r.add_argument("--markdown", help="append the tables to this file")
    args = p.parse_args(argv)
    if args.command == "run":
        for score in args.class_scores:
            try:
                _class_score(score)
            except ValueError:
                p.error(f"--class-scores: {score!r} is not a number or none")
        if not args.skip_test and not args.test:
            p.error("run needs --test DATA_DIR (or --skip-test)")
        return run(args)
    return make(args)


if __name__ == "__main__":
    sys.exit(main())
