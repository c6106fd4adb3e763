"""The shipped downstream task (``data/tasks/``): after four lines of a play, pick its true next line among four
versions of it, three with two neighbouring words swapped.

The three other versions are the same words, so length alone tells nothing; choosing the true line among
other lines of the play instead leaves the shipped models at chance (about 0.3 of 4 choices). Built from the
eval split alone, deterministically from a seed, so ``fca eval`` runs offline and the shipped
JSONL can be rebuilt byte for byte (``build_next_line``); ``data/tasks/fca_next_line.yaml`` is its lm-eval task.
"""

import random
from pathlib import Path

from fca_workbench.data.corpus import DATA_DIR, split_path
from fca_workbench.data.windows import read_documents
from fca_workbench.foundation.files import canonical_json, write_atomic

TASKS_DIR = DATA_DIR / "tasks"
NEXT_LINE_TASK = "fca_next_line"
NEXT_LINE_FILE = "fca_next_line.jsonl"
CONTEXT_LINES = 4  # the lines before the true one, shown as the context
CHOICES = 4  # the true line and three versions of it, each with two neighbouring words swapped
ITEMS_PER_PLAY = 50
LINE_CHARS = (25, 90)  # a spoken line long enough to tell apart, short enough to fit any window
LINE_WORDS = 6  # distinct words a line needs, so three different swaps exist


def next_line_items(texts: list[str], seed: int = 0, per_play: int = ITEMS_PER_PLAY) -> list[dict]:
    """Per play (one text each), ``per_play`` items: ``context`` (the ``CONTEXT_LINES`` lines before a spoken
    line, each ending in a newline), ``choices`` (that line and ``CHOICES - 1`` versions of it with two
    neighbouring words swapped, in a seeded order) and ``label`` (the true line's place among them)."""
    rng = random.Random(seed)
    items = []
    for play, text in enumerate(texts):
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        spoken = [i for i, line in enumerate(lines) if i >= CONTEXT_LINES and is_spoken(line)]
        for i in sorted(rng.sample(spoken, min(per_play, len(spoken)))):
            choices = [lines[i], *swapped(lines[i], CHOICES - 1, rng)]
            rng.shuffle(choices)
            context = "".join(f"{line}\n" for line in lines[i - CONTEXT_LINES : i])
            items.append({"play": play, "context": context, "choices": choices, "label": choices.index(lines[i])})
    return items


def swapped(line: str, count: int, rng: random.Random) -> list[str]:
    """``count`` different versions of ``line``, each with one seeded pair of neighbouring words swapped."""
    words, versions = line.split(" "), []
    for j in rng.sample(range(len(words) - 1), len(words) - 1):
        version = " ".join([*words[:j], words[j + 1], words[j], *words[j + 2 :]])
        if version != line and version not in versions:
            versions.append(version)
        if len(versions) == count:
            return versions
    raise ValueError(f"fewer than {count} different swaps in {line!r}")


def is_spoken(line: str) -> bool:
    """A line of speech: long enough, short enough, of enough distinct words, no stage direction in brackets, not
    a heading in capitals."""
    fits = LINE_CHARS[0] <= len(line) <= LINE_CHARS[1] and len(set(line.split(" "))) >= LINE_WORDS
    return fits and not line.startswith("[") and not line.isupper()


def next_line_jsonl(seed: int = 0) -> bytes:
    """The task's JSONL from the shipped eval split: one item per line (``files.canonical_json``)."""
    items = next_line_items(read_documents(split_path("eval")), seed)
    return "".join(canonical_json(item) + "\n" for item in items).encode()


def build_next_line(folder: Path = TASKS_DIR, seed: int = 0) -> Path:
    """Write the task's JSONL into ``folder`` (atomically) and return its path."""
    path = Path(folder) / NEXT_LINE_FILE
    write_atomic(path, next_line_jsonl(seed))
    return path
