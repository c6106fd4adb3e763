"""The shipped downstream tasks (``data/tasks/``), built from the eval split alone, deterministically from a seed,
so ``fca eval`` runs offline and each shipped JSONL can be rebuilt byte for byte (``task_jsonl``, ``build_task``);
``data/tasks/<name>.yaml`` is each one's lm-eval task.

``fca_next_line`` (200 items): after four lines of a play, pick its true next line among four versions of it, three
with two neighbouring words swapped. The three other versions are the same words, so length alone tells nothing;
choosing the true line among other lines of the play instead leaves the shipped models at chance (about 0.3 of 4).

``fca_play_choice`` (1,600 items, large enough for a gap of a few points to stand out of its paired noise): the same
``next_line`` items, and as many ``next_word`` items: after four lines and the start of a fifth, pick the word that
comes next among four lowercase words of the play of about its length (the other three drawn from the play's
frequent words), so the choice rests on the sense of the line, not on word order or length.
"""

import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from fca_workbench.data.corpus import DATA_DIR, split_path
from fca_workbench.data.windows import read_documents
from fca_workbench.foundation.files import canonical_json, write_atomic

TASKS_DIR = DATA_DIR / "tasks"
NEXT_LINE_TASK = "fca_next_line"
NEXT_LINE_FILE = "fca_next_line.jsonl"
PLAY_CHOICE_TASK = "fca_play_choice"
PLAY_CHOICE_FILE = "fca_play_choice.jsonl"
NEXT_LINE, NEXT_WORD = "next_line", "next_word"  # fca_play_choice's item kinds
CONTEXT_LINES = 4  # the lines before the true one, shown as the context
CHOICES = 4  # the true line (word) and three others
ITEMS_PER_PLAY = 50  # fca_next_line's
PLAY_CHOICE_PER_KIND = 200  # fca_play_choice's items of each kind per play: 4 plays x 2 kinds x 200
LINE_CHARS = (25, 90)  # a spoken line long enough to tell apart, short enough to fit any window
LINE_WORDS = 6  # distinct words a line needs, so three different swaps exist
PREFIX_WORDS = 2  # words of the line shown before the word to choose
FREQUENT = 5  # a next_word distractor is a word the play uses at least this often
WORD_LENGTH_SLACK = 1  # ... and at most this many letters longer or shorter than the true word


def play_lines(text: str) -> tuple[list[str], list[int]]:
    """A play's non-blank lines, stripped, and the indices of its spoken ones that have ``CONTEXT_LINES`` before
    them."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines, [i for i, line in enumerate(lines) if i >= CONTEXT_LINES and is_spoken(line)]


def context_of(lines: list[str], i: int) -> str:
    """The ``CONTEXT_LINES`` lines before line ``i``, each ending in a newline."""
    return "".join(f"{line}\n" for line in lines[i - CONTEXT_LINES : i])


def next_line_item(lines: list[str], i: int, play: int, rng: random.Random) -> dict:
    """Line ``i`` and ``CHOICES - 1`` versions of it with two neighbouring words swapped, in a seeded order."""
    choices = [lines[i], *swapped(lines[i], CHOICES - 1, rng)]
    rng.shuffle(choices)
    return {"play": play, "context": context_of(lines, i), "choices": choices, "label": choices.index(lines[i])}


def next_line_items(texts: list[str], seed: int = 0, per_play: int = ITEMS_PER_PLAY) -> list[dict]:
    """Per play (one text each), ``per_play`` items: ``context`` (the ``CONTEXT_LINES`` lines before a spoken
    line), ``choices`` (``next_line_item``) and ``label`` (the true line's place among them)."""
    rng = random.Random(seed)
    items = []
    for play, text in enumerate(texts):
        lines, spoken = play_lines(text)
        items += [next_line_item(lines, i, play, rng) for i in sorted(rng.sample(spoken, min(per_play, len(spoken))))]
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


def is_plain_word(word: str) -> bool:
    """A lowercase word of letters alone: no name, no punctuation to give the true one away."""
    return word.isalpha() and word.islower()


def frequent_words(lines: list[str], spoken: list[int]) -> list[str]:
    """The plain words the play's spoken lines use at least ``FREQUENT`` times, sorted (a seeded draw from them
    is the same on every rebuild)."""
    counts = Counter(word for i in spoken for word in lines[i].split(" ") if is_plain_word(word))
    return sorted(word for word, count in counts.items() if count >= FREQUENT)


def next_word_item(lines: list[str], i: int, play: int, frequent: list[str], rng: random.Random) -> dict | None:
    """Line ``i`` cut before a seeded plain word after its first ``PREFIX_WORDS`` words, that word and
    ``CHOICES - 1`` frequent words of about its length as the choices (each after a space); None when the line
    has no such word or too few words of that length."""
    words = lines[i].split(" ")
    places = [j for j in range(PREFIX_WORDS, len(words)) if is_plain_word(words[j])]
    if not places:
        return None
    j = rng.choice(places)
    true = words[j]
    alike = [w for w in frequent if w != true and abs(len(w) - len(true)) <= WORD_LENGTH_SLACK]
    if len(alike) < CHOICES - 1:
        return None
    choices = [f" {w}" for w in [true, *rng.sample(alike, CHOICES - 1)]]
    rng.shuffle(choices)
    context = context_of(lines, i) + " ".join(words[:j])
    return {"play": play, "context": context, "choices": choices, "label": choices.index(f" {true}")}


def play_choice_items(texts: list[str], seed: int = 0, per_kind: int = PLAY_CHOICE_PER_KIND) -> list[dict]:
    """Per play, ``per_kind`` ``next_line`` items and ``per_kind`` ``next_word`` items on other lines, each with
    its ``kind``; in the play's order, next_line items first."""
    rng = random.Random(seed)
    items = []
    for play, text in enumerate(texts):
        lines, spoken = play_lines(text)
        frequent = frequent_words(lines, spoken)
        order = rng.sample(spoken, len(spoken))
        line_places = sorted(order[:per_kind])
        items += [{"kind": NEXT_LINE, **next_line_item(lines, i, play, rng)} for i in line_places]
        words: list[dict] = []
        for i in order[per_kind:]:
            item = next_word_item(lines, i, play, frequent, rng)
            if item is not None:
                words.append({"kind": NEXT_WORD, "line": i, **item})
            if len(words) == per_kind:
                break
        items += [{k: v for k, v in item.items() if k != "line"} for item in sorted(words, key=lambda x: x["line"])]
    return items


TASK_ITEMS: dict[str, tuple[str, Callable[[list[str], int], list[dict]]]] = {
    NEXT_LINE_TASK: (NEXT_LINE_FILE, next_line_items),
    PLAY_CHOICE_TASK: (PLAY_CHOICE_FILE, play_choice_items),
}


def task_jsonl(task: str = NEXT_LINE_TASK, seed: int = 0) -> bytes:
    """A shipped task's JSONL from the shipped eval split: one item per line (``files.canonical_json``)."""
    items = TASK_ITEMS[task][1](read_documents(split_path("eval")), seed)
    return "".join(canonical_json(item) + "\n" for item in items).encode()


def build_task(task: str, folder: Path = TASKS_DIR, seed: int = 0) -> Path:
    """Write a shipped task's JSONL into ``folder`` (atomically) and return its path."""
    path = Path(folder) / TASK_ITEMS[task][0]
    write_atomic(path, task_jsonl(task, seed))
    return path
