"""Shipped corpus splits, loaders and the tokenizer."""

import gzip
import hashlib
import json
import re

import pytest
import torch

from fca_workbench.data.corpus import DATA_DIR, SPLITS, split_path
from fca_workbench.data.tokenizer import load_tokenizer
from fca_workbench.data.windows import load_windows, make_windows, read_documents, token_stream
from fca_workbench.foundation.errors import UserError


def works(split):
    with gzip.open(split_path(split), "rt", encoding="utf-8") as handle:
        return [json.loads(line)["work"] for line in handle]


def test_splits_share_no_work():
    by_split = {split: set(works(split)) for split in SPLITS}
    assert all(by_split.values())
    assert not by_split["train"] & by_split["eval"]
    assert not by_split["train"] & by_split["calibration"]
    assert not by_split["eval"] & by_split["calibration"]
    assert not any(work.endswith("_f") for names in by_split.values() for work in names)


def test_splits_share_no_window():
    tokenizer = load_tokenizer()
    windows = {split: load_windows(split_path(split), tokenizer, 64) for split in SPLITS}
    seen = {split: {tuple(w.tolist()) for w in windows[split]} for split in SPLITS}
    assert not seen["eval"] & seen["train"]
    assert not seen["eval"] & seen["calibration"]
    assert not seen["calibration"] & seen["train"]


def test_data_readme_records_the_shipped_files_sha256():
    readme = (DATA_DIR / "README.md").read_text()
    for split in SPLITS:
        digest = hashlib.sha256(split_path(split).read_bytes()).hexdigest()
        assert digest in readme, f"data/README.md does not carry the sha256 of {split}"
        for work in works(split):
            assert re.search(rf"\b{work}\b", readme)


def test_tokenizer_round_trips_the_eval_text():
    tokenizer = load_tokenizer()
    assert 3500 <= len(tokenizer) <= 4096
    for text in read_documents(split_path("eval")):
        assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


def test_windows_are_fixed_length_and_cover_the_stream_in_order():
    stream = torch.arange(103)
    windows = make_windows(stream, 10)
    assert windows.shape == (10, 10)
    assert torch.equal(windows.flatten(), stream[:100])


def test_text_and_jsonl_inputs_give_the_same_tokens(tmp_path):
    tokenizer = load_tokenizer()
    plain, jsonl = tmp_path / "a.txt", tmp_path / "a.jsonl"
    plain.write_text("To be, or not to be: that is the question.\n" * 20, encoding="utf-8")
    jsonl.write_text(json.dumps({"text": plain.read_text()}) + "\n", encoding="utf-8")
    assert torch.equal(token_stream(tokenizer, read_documents(plain)), token_stream(tokenizer, read_documents(jsonl)))


@pytest.mark.parametrize(
    "payload, message",
    [
        (b"", "contains no text"),
        (b"   \n\n", "contains no text"),
        (b"caf\xe9 latin-1", "not UTF-8"),
    ],
)
def test_bad_text_files_raise_one_line_errors(tmp_path, payload, message):
    path = tmp_path / "bad.txt"
    path.write_bytes(payload)
    with pytest.raises(UserError, match=message) as error:
        read_documents(path)
    assert "\n" not in str(error.value)


def test_bad_jsonl_names_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine"}\n{"txt": "oops"}\n', encoding="utf-8")
    with pytest.raises(UserError, match="line 2"):
        read_documents(path)


def test_text_shorter_than_a_window_is_refused(tmp_path):
    path = tmp_path / "short.txt"
    path.write_text("Exeunt.", encoding="utf-8")
    with pytest.raises(UserError, match="fewer than one window"):
        load_windows(path, load_tokenizer(), 256)


def test_max_windows_spreads_the_sample_over_every_work():
    import numpy as np

    tokenizer = load_tokenizer()
    everything = load_windows(split_path("eval"), tokenizer, 256)
    sample = load_windows(split_path("eval"), tokenizer, 256, max_windows=16)
    expected = np.linspace(0, len(everything) - 1, 16).round().astype(int)  # independent of the code's torch
    assert torch.equal(sample, everything[torch.from_numpy(expected)])
    assert expected[-1] == len(everything) - 1 and len(set(expected.tolist())) == 16
    # which work each sampled window starts in: cumulative token counts of the documents (each + EOS)
    ends = np.cumsum([len(tokenizer(text)["input_ids"]) + 1 for text in read_documents(split_path("eval"))])
    starts_in = {int(np.searchsorted(ends, index * 256, side="right")) for index in expected}
    assert starts_in == set(range(len(works("eval"))))
    assert torch.equal(load_windows(split_path("eval"), tokenizer, 256, max_windows=10**6), everything)
    with pytest.raises(UserError, match="at least 1"):
        load_windows(split_path("eval"), tokenizer, 256, max_windows=0)
