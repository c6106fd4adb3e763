"""Text files in, fixed-length windows out.

Windows are the unit of batching, reassignment and bootstrap throughout the workbench, so everything
downstream sees a ``LongTensor [N, window]``.

Text is streamed, never held whole: it is read in blocks (normalised by ``corpus.TextNormalizer``, at most
``TEXT_MAX_BYTES`` of it), cut into chunks only where cutting cannot change a token, and tokenized twice: once
to count the tokens, then only the chunks the chosen windows need. So memory follows the windows used, not
the size of the file, and the windows are exactly those of tokenizing every document whole.
"""

from __future__ import annotations

import codecs
import gzip
import os
import re
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # the tokenizer's type only: importing transformers here would slow every import of data
    from transformers import PreTrainedTokenizerBase

from fca_workbench.data.corpus import TextNormalizer, normalize_text
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.files import parse_json

TEXT_MAX_BYTES = 256 << 20  # of text, after decompression: far above the shipped splits (~0.6 MB each)


BLOCK_BYTES = 1 << 20  # read at a time


CHUNK_CHARS = 1 << 17  # text tokenized at a time (a chunk ends at the first BOUNDARY from here on)


BATCH_CHUNKS = 4  # chunks tokenized in one call when counting


# A space or LF between two non-space characters: no token of a byte-level BPE (GPT-2's pre-tokenizer regex)
# crosses it, so the text on either side tokenizes alone as it does in the whole. Whether that holds for a
# given tokenizer is tried on PROBE (``Chunking.of``); where it does not, documents are tokenized whole.
BOUNDARY = re.compile(r"(?<=\S)[ \n](?=\S)")


PROBE = 'First Citizen:\nBefore we proceed, hear me \'tis 1599; naïve café—ok?\nEnd. 12 34\n"Quote" (x) a-b'


@dataclass(frozen=True)
class Chunking:
    """How a tokenizer's documents are tokenized: in chunks cut at ``BOUNDARY`` (without special tokens, the
    ``prefix`` and ``suffix`` it adds around a document put back), or each document whole as it comes."""

    split: bool
    prefix: tuple[int, ...] = ()
    suffix: tuple[int, ...] = ()

    @classmethod
    def of(cls, tokenizer: PreTrainedTokenizerBase) -> Chunking:
        plain = token_ids(tokenizer, PROBE, special=False)
        full = token_ids(tokenizer, PROBE, special=True)
        starts = [i for i in range(len(full) - len(plain) + 1) if full[i : i + len(plain)] == plain]
        cuts = [m.start() for m in BOUNDARY.finditer(PROBE)]
        exact = all(
            token_ids(tokenizer, PROBE[:cut], False) + token_ids(tokenizer, PROBE[cut:], False) == plain for cut in cuts
        )
        if not starts or not exact:
            return cls(split=False)
        start = starts[0]
        return cls(split=True, prefix=tuple(full[:start]), suffix=tuple(full[start + len(plain) :]))


def token_ids(tokenizer: PreTrainedTokenizerBase, text: str, special: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def raw_blocks(path: Path) -> Iterator[bytes]:
    """The bytes of a file (decompressed when it ends in ``.gz``), a block at a time; a missing, unreadable
    or oversized file is a one-line ``UserError``."""
    if path.is_dir():
        raise UserError(f"{path} is a folder, not a text file")
    if not path.is_file():
        raise UserError(f"text file not found: {path}")
    gzipped, read = path.suffix == ".gz", 0
    too_large = UserError(
        f"{path} holds more than {TEXT_MAX_BYTES >> 20} MiB of text{' once decompressed' if gzipped else ''}; "
        "the workbench reads at most that much from one text file"
    )
    if not gzipped and path.stat().st_size > TEXT_MAX_BYTES:
        raise too_large
    try:
        with gzip.open(path, "rb") if gzipped else open(path, "rb") as handle:
            while block := handle.read(BLOCK_BYTES):
                read += len(block)
                if read > TEXT_MAX_BYTES:
                    raise too_large
                yield block
    except (OSError, EOFError, zlib.error) as exc:
        if gzipped:
            raise UserError(f"{path} is not a readable gzip file: {exc}") from None
        raise UserError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None


def check_size(path: Path) -> None:
    """Refuse a text over ``TEXT_MAX_BYTES`` before any of it is tokenized (a gzip file is decompressed once
    to count, far faster than tokenizing what it holds)."""
    blocks = raw_blocks(path)
    if path.suffix != ".gz":
        next(blocks, None)  # a plain file's size is checked before its first block
        return
    for _ in blocks:
        pass


def text_blocks(path: Path) -> Iterator[str]:
    """The normalised text of a UTF-8 file (``raw_blocks``), a block at a time; bytes that are not UTF-8 are a
    one-line ``UserError`` naming the offset."""
    decoder, normalizer, read = codecs.getincrementaldecoder("utf-8")(), TextNormalizer(), 0
    for block in raw_blocks(path):
        read += len(block)
        yield normalizer.feed(decode(decoder, block, read, path))
    yield normalizer.feed(decode(decoder, b"", read, path, final=True)) + normalizer.finish()


def decode(decoder: codecs.IncrementalDecoder, block: bytes, read: int, path: Path, final: bool = False) -> str:
    try:
        return decoder.decode(block, final=final)
    except UnicodeDecodeError as exc:
        offset = read - len(exc.object) + exc.start  # the decoder's held-back bytes come before this block
        raise UserError(f"{path} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {offset})") from None


def lines(blocks: Iterable[str]) -> Iterator[str]:
    """The LF-separated lines of text given in blocks (a long line's blocks joined once, not over and over)."""
    held: list[str] = []
    for block in blocks:
        if "\n" not in block:
            held.append(block)
            continue
        first, *middle, last = block.split("\n")
        yield "".join([*held, first])
        yield from middle
        held = [last]
    if tail := "".join(held):
        yield tail


def parse_jsonl(text_lines: Iterable[str], path: Path) -> Iterator[str]:
    """The ``text`` field of each non-blank line; a line that is not such a record is a one-line ``UserError``."""
    for number, line in enumerate(text_lines, start=1):
        if not line.strip():
            continue
        record = parse_json(line.removeprefix("\ufeff") if number == 1 else line, f"{path} line {number}")
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise UserError(f'{path} line {number} has no string field "text"')
        yield normalize_text(record["text"])


def documents(path: str | Path) -> Iterator[Iterable[str]]:
    """The documents of a text file, each as pieces of its text: a plain file is one document streamed in
    blocks; JSONL (``{"text": ...}`` per line) gives one non-blank record at a time."""
    path = Path(path)
    if path.name.removesuffix(".gz").endswith(".jsonl"):
        for text in parse_jsonl(lines(text_blocks(path)), path):
            if text.strip():
                yield (text,)
    else:
        yield text_blocks(path)


def read_documents(path: str | Path) -> list[str]:
    """Documents from a UTF-8 text file (one document) or JSONL of ``{"text": ...}``, optionally gzipped."""
    check_size(Path(path))
    texts = [text for text in ("".join(pieces) for pieces in documents(path)) if text.strip()]
    if not texts:
        raise UserError(f"{path} contains no text")
    return texts


def chunks(pieces: Iterable[str], split: bool) -> Iterator[str]:
    """The text of ``pieces`` in chunks of at least ``CHUNK_CHARS``, each ending before the first ``BOUNDARY``
    from there (the whole text as one chunk when not ``split``); each piece is copied once, however many
    chunks it holds."""
    if not split:
        if text := "".join(pieces):
            yield text
        return
    buffer, searched = "", CHUNK_CHARS  # no boundary between CHUNK_CHARS and ``searched`` of the buffer
    for piece in pieces:
        buffer, start = buffer + piece, 0
        while len(buffer) - start > CHUNK_CHARS:
            cut = BOUNDARY.search(buffer, start + searched)
            if cut is None:
                searched = len(buffer) - start - 1  # the last character's fate waits for the next piece
                break
            yield buffer[start : cut.start()]
            start, searched = cut.start(), CHUNK_CHARS
        buffer = buffer[start:]
    if buffer:
        yield buffer


def pieces_of(texts: Iterable[Iterable[str]], chunking: Chunking, eos: int | None, source: object) -> Iterator:
    """The token stream of ``texts`` (documents, as ``documents`` gives them) as pieces in order: text chunks
    (``str``) still to tokenize and the special tokens around each document (``tuple`` of ids), EOS last."""
    if eos is None:
        raise UserError("the tokenizer has no end-of-text token to separate documents with")
    seen_text = False
    for pieces in texts:
        if chunking.prefix:
            yield chunking.prefix
        for chunk in chunks(pieces, chunking.split):
            seen_text = seen_text or bool(chunk.strip())
            yield chunk
        yield (*chunking.suffix, eos)
    if not seen_text:
        raise UserError(f"{source} contains no text")


def piece_ids(tokenizer: PreTrainedTokenizerBase, pieces: Iterable, chunking: Chunking) -> Iterator[list[int]]:
    """Every piece's token ids, in order; text chunks tokenized ``BATCH_CHUNKS`` at a time."""
    batch: list = []

    def flush() -> Iterator[list[int]]:
        texts = [piece for piece in batch if isinstance(piece, str)]
        encoded = iter(tokenizer(texts, add_special_tokens=not chunking.split)["input_ids"] if texts else ())
        for piece in batch:
            yield list(next(encoded)) if isinstance(piece, str) else list(piece)
        batch.clear()

    for piece in pieces:
        batch.append(piece)
        if len(batch) >= BATCH_CHUNKS:
            yield from flush()
    yield from flush()


def token_stream(tokenizer: PreTrainedTokenizerBase, documents: list[str]) -> torch.Tensor:
    """All documents' tokens end to end, each followed by EOS so windows can cross document borders."""
    chunking = Chunking.of(tokenizer)
    pieces = pieces_of([(doc,) for doc in documents], chunking, tokenizer.eos_token_id, "the text")
    ids = [torch.tensor(piece, dtype=torch.long) for piece in piece_ids(tokenizer, pieces, chunking)]
    return torch.cat(ids)


def make_windows(stream: torch.Tensor, window: int) -> torch.Tensor:
    """Non-overlapping windows ``[N, window]``; the tail shorter than a window is dropped."""
    check_window(window)
    count = len(stream) // window
    if count == 0:
        raise UserError(f"text has {len(stream)} tokens, fewer than one window of {window}")
    return stream[: count * window].view(count, window)


def check_window(window: int) -> None:
    if window < 2:
        raise UserError(f"window must be at least 2 tokens, got {window}")


def load_windows(
    path: str | Path, tokenizer: PreTrainedTokenizerBase, window: int, max_windows: int | None = None
) -> torch.Tensor:
    """The text's windows; ``max_windows`` of them spread evenly over it (``even_sample``) when given.

    The first pass counts the tokens of every chunk (keeping them when every window is wanted); the second
    tokenizes only the chunks the sampled windows cover."""
    path = Path(path)
    check_window(window)
    stamp = file_stamp(path)
    check_size(path)
    chunking, eos = Chunking.of(tokenizer), tokenizer.eos_token_id
    counts, kept = [], []
    for ids in piece_ids(tokenizer, pieces_of(documents(path), chunking, eos, path), chunking):
        counts.append(len(ids))
        if max_windows is None:
            kept.append(torch.tensor(ids, dtype=torch.long))
    if max_windows is None:
        return make_windows(torch.cat(kept), window)
    total = sum(counts)
    if total < window:
        raise UserError(f"text has {total} tokens, fewer than one window of {window}")
    chosen = even_sample(total // window, max_windows)
    pieces = pieces_of(documents(path), chunking, eos, path)
    windows = sampled_windows(pieces, counts, chosen, window, tokenizer, chunking)
    if file_stamp(path) != stamp:
        raise UserError(f"{path} changed while it was read; run again once it is written")
    return windows


def sampled_windows(
    pieces: Iterable,
    counts: list[int],
    chosen: torch.Tensor,
    window: int,
    tokenizer: PreTrainedTokenizerBase,
    chunking: Chunking,
) -> torch.Tensor:
    """The windows ``chosen`` (ascending indices) of the stream whose pieces are ``pieces`` and have
    ``counts`` tokens each, tokenizing only the pieces a chosen window covers."""
    starts = (chosen * window).tolist()
    windows = torch.empty(len(starts), window, dtype=torch.long)
    first, position = 0, 0  # windows before ``first`` are complete; ``position``: where this piece starts
    for piece, count in zip(pieces, counts):
        end = position + count
        while first < len(starts) and starts[first] + window <= position:
            first += 1
        if first == len(starts):
            break
        if starts[first] < end:
            text = isinstance(piece, str)
            ids = torch.tensor(token_ids(tokenizer, piece, not chunking.split) if text else piece, dtype=torch.long)
            if len(ids) != count:
                raise UserError("the text changed while it was read; run again once it is written")
            for row in range(first, len(starts)):
                start = starts[row]
                if start >= end:
                    break
                low, high = max(start, position), min(start + window, end)
                windows[row, low - start : high - start] = ids[low - position : high - position]
        position = end
    return windows


def file_stamp(path: Path) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_size, stat.st_mtime_ns


def window_sampling(max_windows: int | None) -> str:
    """How ``load_windows`` picked its windows, as audits and model cards record it: ``even`` (``max_windows``
    spread over the text) or ``all``. Figures over other windows of the same text are not comparable."""
    return "even" if max_windows else "all"


def even_sample(count: int, size: int) -> torch.Tensor:
    """``size`` window indices evenly spaced over ``range(count)``, first and last included (all when
    ``size >= count``): a small sample sees every work of a split, not only the opening of the first."""
    if size < 1:
        raise UserError(f"--max-windows must be at least 1, got {size}")
    if size >= count:
        return torch.arange(count)
    return torch.linspace(0, count - 1, size, dtype=torch.float64).round().long()
