"""Every file reader, fed malformed bytes (issue 23): a ``UserError`` of one line, or success, never another
exception. Each reader starts from a valid file of its kind and is fed random bytes, truncations and bit
flips of it, JSON nested 100,000 deep (and just under the parser's limit), JSON of the wrong type, and the
valid structure with one value replaced by any JSON value or one key removed."""

import argparse
import csv
import io
import json
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import TINY_MIXTRAL, tiny_model
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file
from test_hub import COMMIT, cache_snapshot, offline_cache, write_tree  # noqa: F401 (offline_cache is a fixture)

from fca_workbench.adapters.controlled import load_controlled
from fca_workbench.audit.budget import audit_batch_size
from fca_workbench.audit.capture import read_manifest
from fca_workbench.data.tokenizer import TOKENIZER_DIR, load_tokenizer
from fca_workbench.data.windows import read_documents
from fca_workbench.foundation.checkpoint import TRAIN_LOG_FILE, TRAIN_STATE_FILE, resolve_checkpoint
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.files import safetensors_shapes
from fca_workbench.models import FAMILIES
from fca_workbench.models.loading import read_config, stored_shapes
from fca_workbench.notebooks.reproduce import load_config
from fca_workbench.results.frames import load_audit
from fca_workbench.results.outputs import refuse_foreign
from fca_workbench.results.schema import AUDIT_SCHEMA, validate_audit
from fca_workbench.training.hf_config import build_hf_model, read_hf_config
from fca_workbench.training.train import make_optimizer
from fca_workbench.training.train_settings import TrainSettings
from fca_workbench.training.train_state import read_log, read_state, restore, save_state
from fca_workbench.viewmodel.pool import Registry
from fca_workbench.viewmodel.serving import basic_auth_option

FUZZ = settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
FEW = settings(FUZZ, max_examples=10)  # readers that build a model per example
MANY = settings(FUZZ, max_examples=40)  # fast readers with many kinds of damage

DEEP = [
    b"[" * 100_000,
    b'{"a": ' * 100_000,
    b"[" * 990 + b"]" * 990,  # parses; deep enough to trip whatever recurses into it afterwards
    b'{"a": ' * 490 + b"1" + b"}" * 490,
]
ALWAYS_DEEP = example(DEEP[0])  # every JSON reader meets the 100,000 levels, whatever else is drawn
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


def one_line_or_success(read: Callable[[], object]) -> None:
    """Run ``read``: success, or a ``UserError`` whose message is one non-empty line; anything else raises."""
    try:
        read()
    except UserError as exc:
        message = str(exc)
        assert message.strip() and len(message.splitlines()) == 1, repr(message)


def flipped(payload: bytes, flips: list[tuple[int, int]]) -> bytes:
    data = bytearray(payload)
    for position, bit in flips:
        data[position % len(data)] ^= 1 << bit
    return bytes(data)


def paths(value: object, prefix: tuple = (), limit: int = 4) -> list[tuple]:
    """Every key path into ``value`` (dicts and lists), up to ``limit`` deep."""
    found = [prefix] if prefix else []
    if len(prefix) < limit:
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, inner in items:
            found += paths(inner, (*prefix, key), limit)
    return found


def replaced(value: object, path: tuple, new: object) -> object:
    """``value`` with the node at ``path`` replaced by ``new`` (``...``: removed)."""
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)  # type: ignore[call-overload]
    if len(path) == 1 and new is ...:
        del copy[path[0]]
    else:
        copy[path[0]] = replaced(copy[path[0]], path[1:], new)
    return copy


def nested_deep(value: object, path: tuple, depth: int = 900) -> bytes:
    """``value`` as JSON with the node at ``path`` replaced by an array ``depth`` deep."""
    marker = "\x00deep\x00"
    text = json.dumps(replaced(value, path, marker))
    return text.replace(json.dumps(marker), "[" * depth + "]" * depth).encode()


def malformed(valid: bytes, structured: bool = True) -> st.SearchStrategy[bytes]:
    """Bytes of every kind of damage to ``valid`` (a JSON file when ``structured``)."""
    damage = [
        st.binary(max_size=300),
        st.integers(0, len(valid) - 1).map(lambda n: valid[:n]),
        st.lists(st.tuples(st.integers(0, len(valid) - 1), st.integers(0, 7)), min_size=1, max_size=6).map(
            lambda flips: flipped(valid, flips)
        ),
    ]
    if structured:
        value = json.loads(valid)
        keys = paths(value)
        damage += [
            st.sampled_from(DEEP),
            JSON_VALUES.map(lambda v: json.dumps(v).encode()),
            st.tuples(st.sampled_from(keys), JSON_VALUES | st.just(...)).map(
                lambda change: json.dumps(replaced(value, *change)).encode()
            ),
            st.sampled_from(keys).map(lambda path: nested_deep(value, path)),
            st.just(b"\xef\xbb\xbf" + valid),  # a UTF-8 BOM: still the valid file
        ]
    return st.one_of(damage)


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoints, place):
    return shutil.copytree(tiny_checkpoints["featuregate"], place / "checkpoint")


# --------------------------------------------------------------------------------------------------------
# JSON readers


@pytest.fixture(scope="module")
def config_folder(checkpoint, place):
    folder = place / "config"
    folder.mkdir()
    shutil.copy(checkpoint / "config.json", folder / "config.json")
    return folder


def test_checkpoint_config(config_folder):
    valid = (config_folder / "config.json").read_bytes()

    @FUZZ
    @given(malformed(valid))
    @ALWAYS_DEEP
    def read(payload):
        (config_folder / "config.json").write_bytes(payload)
        one_line_or_success(lambda: read_config(config_folder, FAMILIES))

    read()


def test_checkpoint_config_through_the_loader(checkpoint):
    valid = (checkpoint / "config.json").read_bytes()

    @FEW
    @given(malformed(valid))
    @ALWAYS_DEEP
    def read(payload):
        (checkpoint / "config.json").write_bytes(payload)
        one_line_or_success(lambda: load_controlled(checkpoint))

    try:
        read()
    finally:
        (checkpoint / "config.json").write_bytes(valid)


@pytest.fixture(scope="module")
def sharded(place):
    folder = place / "sharded"
    folder.mkdir()
    state = {k: v.detach().clone() for k, v in tiny_model("featuregate").state_dict().items()}
    keys = sorted(state)
    weight_map = {}
    for number, part in enumerate((keys[::2], keys[1::2]), start=1):
        name = f"model-{number:05d}-of-00002.safetensors"
        save_file({k: state[k] for k in part}, folder / name)
        weight_map.update(dict.fromkeys(part, name))
    index = {"metadata": {"total_size": 1}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


def test_shard_index(sharded):
    path = sharded / "model.safetensors.index.json"
    valid = path.read_bytes()

    @FUZZ
    @given(malformed(valid))
    @ALWAYS_DEEP
    def read(payload):
        path.write_bytes(payload)
        one_line_or_success(lambda: stored_shapes(path))

    read()


@pytest.fixture(scope="module")
def tokenizer_folder(place):
    return shutil.copytree(TOKENIZER_DIR, place / "tokenizer")


def test_tokenizer_json(tokenizer_folder):
    path = tokenizer_folder / "tokenizer.json"
    valid = path.read_bytes()
    specific = st.sampled_from(
        [
            b"[]",
            b"{}",
            json.dumps({"version": "1.0", "model": {"type": "NoSuchModel"}, "added_tokens": []}).encode(),
            json.dumps({**json.loads(valid), "model": []}).encode(),
        ]
    )

    @FUZZ
    @given(specific | malformed(valid))
    @ALWAYS_DEEP
    def read(payload):
        path.write_bytes(payload)
        one_line_or_success(lambda: load_tokenizer(tokenizer_folder))

    read()


@pytest.fixture(scope="module")
def audit_folder(checkpoint, place):
    """A real audit of the tiny checkpoint (its audit.json and its cache's manifest.json)."""
    from fca_workbench.audit.run import AuditSettings, run_audit

    folder = place / "audit"
    settings = AuditSettings(checkpoint=str(checkpoint), window=32, max_windows=4, batch_size=2, resamples=50)
    run_audit(settings, folder)
    return folder


def test_audit_json(audit_folder, place):
    valid = (audit_folder / "audit.json").read_bytes()
    folder = place / "audit-copy"
    folder.mkdir()

    @FUZZ
    @given(malformed(valid))
    @ALWAYS_DEEP
    def read(payload):
        (folder / "audit.json").write_bytes(payload)
        one_line_or_success(lambda: load_audit(folder))
        one_line_or_success(lambda: refuse_foreign(folder / "audit.json", AUDIT_SCHEMA, validate_audit))

    read()


def test_cache_manifest(audit_folder, place):
    valid = (audit_folder / "cache" / "eval" / "manifest.json").read_bytes()
    folder = place / "manifest"
    folder.mkdir()

    @FUZZ
    @given(malformed(valid))
    @ALWAYS_DEEP
    def read(payload):
        (folder / "manifest.json").write_bytes(payload)
        one_line_or_success(lambda: read_manifest(folder))
        assert audit_batch_size(None, 32, "cpu", folder) >= 1  # never a batch size of 0 from a damaged manifest

    read()


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_reproduce_config(suffix, place):
    path = place / f"reproduce{suffix}"
    config = {"notebooks": ["01_quickstart"], "parameters": {"max_windows": 4}, "notebook": {"x": {"seed": 1}}}
    toml = b'notebooks = ["01_quickstart"]\n[parameters]\nmax_windows = 4\n[notebook.x]\nseed = 1\n'
    valid = json.dumps(config).encode() if suffix == ".json" else toml
    deep_toml = st.sampled_from([b"a = " + b"[" * 100_000, b"a = " + b"[" * 900 + b"]" * 900])

    @FUZZ
    @given(malformed(valid) if suffix == ".json" else malformed(valid, structured=False) | deep_toml)
    @example(DEEP[0] if suffix == ".json" else b"a = " + DEEP[0])
    def read(payload):
        path.write_bytes(payload)
        one_line_or_success(lambda: load_config(path))

    read()


def test_train_hf_config(place):
    path = place / "hf_config.json"
    valid = json.dumps({"model_type": "mixtral", **TINY_MIXTRAL}).encode()
    tokenizer = load_tokenizer()

    @FEW
    @given(malformed(valid))
    @ALWAYS_DEEP
    def read(payload):
        path.write_bytes(payload)
        one_line_or_success(lambda: build_hf_model(read_hf_config(path), tokenizer, 32))

    read()


def test_registry(checkpoint, place):
    path = place / "registry.json"
    valid = json.dumps({"checkpoints": {"tiny": str(checkpoint), "other": "relative/folder"}}).encode()

    @FUZZ
    @given(malformed(valid))
    @ALWAYS_DEEP
    def read(payload):
        path.write_bytes(payload)
        one_line_or_success(lambda: Registry.from_file(path))

    read()


def test_basic_auth_file(place):
    path = place / "credentials.json"
    valid = json.dumps({"alice": "a long enough password", "bob": "another long password"}).encode()
    args = argparse.Namespace(basic_auth=None, basic_auth_file=str(path), basic_auth_password_file=None)

    @FUZZ
    @given(malformed(valid))
    @ALWAYS_DEEP
    def read(payload):
        path.write_bytes(payload)
        one_line_or_success(lambda: basic_auth_option(args))

    read()


def test_eval_jsonl(place):
    path = place / "eval.jsonl"
    lines = [json.dumps({"text": f"document {n} with some words"}) for n in range(4)]
    valid = ("\n".join(lines) + "\n").encode()
    line_damage = st.tuples(st.integers(0, 3), malformed(lines[0].encode())).map(
        lambda change: b"\n".join(change[1] if n == change[0] else line.encode() for n, line in enumerate(lines))
    )

    @FUZZ
    @given(line_damage | malformed(valid, structured=False))
    @example(b'{"text": "fine"}\n' + DEEP[0])
    def read(payload):
        path.write_bytes(payload)
        one_line_or_success(lambda: read_documents(path))

    read()


def test_a_bom_at_the_start_of_jsonl_is_accepted(place):
    path = place / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"text": "first"}\n{"text": "second \xe2\x80\xa8 still the second"}\n')
    assert read_documents(path) == ["first", "second \u2028 still the second"]


def test_hub_tree_listing(offline_cache, checkpoint):  # noqa: F811  (the fixture imported above)
    """``trees/<sha>.json``, which huggingface_hub reads with a bare ``json.load`` when a hub name resolves."""
    snapshot = cache_snapshot(offline_cache, "lab/fg", checkpoint)
    tree = write_tree(snapshot, sorted(p.name for p in snapshot.iterdir()))
    valid = tree.read_bytes()

    @FUZZ
    @given(malformed(valid))
    @ALWAYS_DEEP
    @example(b"[]")
    def read(payload):
        tree.write_bytes(payload)
        one_line_or_success(lambda: resolve_checkpoint("lab/fg"))

    read()


def test_hub_ref(offline_cache, checkpoint):  # noqa: F811  (the fixture imported above)
    """``refs/<branch>``, the commit a branch of a cached repository is at."""
    cache_snapshot(offline_cache, "lab/fg", checkpoint)
    ref = offline_cache / "models--lab--fg" / "refs" / "main"

    @FUZZ
    @given(malformed(COMMIT.encode(), structured=False) | st.sampled_from(DEEP))
    def read(payload):
        ref.write_bytes(payload)
        one_line_or_success(lambda: resolve_checkpoint("lab/fg"))

    read()


# --------------------------------------------------------------------------------------------------------
# Files libraries parse: safetensors headers, the training log, the trainer state


def safetensors_file(header: dict, data: bytes) -> bytes:
    encoded = json.dumps(header).encode()
    return struct.pack("<Q", len(encoded)) + encoded + data


@pytest.fixture(scope="module")
def weights(place):
    path = place / "weights.safetensors"
    save_file({"a": torch.arange(12.0).reshape(3, 4), "b": torch.ones(5, dtype=torch.int64)}, path)
    return path


def header_damage(valid: bytes) -> st.SearchStrategy[bytes]:
    """The header's JSON damaged as JSON (with the true data after it), and the length prefix lying."""
    (length,) = struct.unpack("<Q", valid[:8])
    header, data = json.loads(valid[8 : 8 + length]), valid[8 + length :]
    keys = paths(header)
    return st.one_of(
        st.tuples(st.sampled_from(keys), JSON_VALUES | st.just(...)).map(
            lambda change: safetensors_file(replaced(header, *change), data)
        ),
        st.integers(0, 2**64 - 1).map(lambda n: struct.pack("<Q", n) + valid[8:]),
        st.sampled_from(DEEP).map(lambda deep: struct.pack("<Q", len(deep)) + deep + data),
        st.just(safetensors_file({"a": {"dtype": "F32", "shape": [10**12, 10**6], "data_offsets": [0, 48]}}, data)),
        st.just(safetensors_file({"a": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 10**15]}}, data)),
    )


def test_safetensors_header(weights):
    valid = weights.read_bytes()
    path = weights.with_name("damaged.safetensors")
    assert safetensors_shapes(weights) == {"a": (3, 4), "b": (5,)}

    @MANY
    @given(header_damage(valid) | malformed(valid, structured=False))
    def read(payload):
        path.write_bytes(payload)
        one_line_or_success(lambda: safetensors_shapes(path))

    read()


@pytest.fixture(scope="module")
def foreign(place):
    import transformers

    folder = place / "foreign"
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=32)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


def test_foreign_safetensors_through_the_loader(foreign):
    path = foreign / "model.safetensors"
    valid = path.read_bytes()

    @FEW
    @given(header_damage(valid))
    def read(payload):
        path.write_bytes(payload)
        one_line_or_success(lambda: load_controlled(foreign))

    try:
        read()
    finally:
        path.write_bytes(valid)


def test_train_log(place):
    out = place / "log-run"
    out.mkdir()
    rows = [{"step": n, "loss": 5.0 - n / 10, "lr": 1e-3, "tokens_seen": 64 * n, "seconds": n / 3} for n in range(1, 5)]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    valid = buffer.getvalue().encode()
    specific = st.sampled_from(
        [b"", b"step\n", b"step,loss\nx,1\n", b"\x00\x01\x02", b'"unterminated\n', b"a,b\n1,2\n"]
    )

    @FUZZ
    @given(specific | malformed(valid, structured=False))
    def read(payload):
        (out / TRAIN_LOG_FILE).write_bytes(payload)
        one_line_or_success(lambda: read_log(out, 3))

    read()


@pytest.fixture(scope="module")
def trainer_state(place):
    """A real trainer state of a tiny run (saved after 2 of 4 steps), and what resuming it needs."""
    from fca_workbench.training.train import build_model

    run = TrainSettings(arch="dense", layers=1, width=16, heads=2, window=16, steps=4, batch_size=2)
    model = build_model(run, load_tokenizer())
    optimizer, scheduler = make_optimizer(model, run)
    for _ in range(2):
        model(torch.zeros(1, 8, dtype=torch.long), labels=torch.zeros(1, 8, dtype=torch.long)).loss.backward()
        optimizer.step()
        scheduler.step()
    out = place / "state-run"
    out.mkdir()
    save_state(out, run, model, optimizer, scheduler, 2, [])
    return out, run, model


def resume(out: Path, run: TrainSettings, model: torch.nn.Module) -> None:
    state = read_state(out, run)
    optimizer, scheduler = make_optimizer(model, run)
    restore(state, model, optimizer, scheduler)


def test_trainer_state_bytes(trainer_state):
    out, run, model = trainer_state
    valid = (out / TRAIN_STATE_FILE).read_bytes()

    @FUZZ
    @given(malformed(valid, structured=False))
    def read(payload):
        (out / TRAIN_STATE_FILE).write_bytes(payload)
        one_line_or_success(lambda: resume(out, run, model))

    try:
        read()
    finally:
        (out / TRAIN_STATE_FILE).write_bytes(valid)


TENSORS = st.builds(
    lambda shape, integer: torch.zeros(shape, dtype=torch.long if integer else torch.float32),
    st.lists(st.integers(0, 4), max_size=3),
    st.booleans(),
)


def test_trainer_state_structure(trainer_state):
    """What a planted or damaged state holds once unpickled: any value where a step, a tensor, an optimizer
    moment or a scheduler field should be."""
    out, run, model = trainer_state
    state = torch.load(out / TRAIN_STATE_FILE, weights_only=True)
    places = paths(state, limit=5)
    values = JSON_VALUES | TENSORS | st.just(...)

    @MANY
    @given(st.lists(st.tuples(st.sampled_from(places), values), min_size=1, max_size=3))
    def read(changes):
        damaged = state
        for where, value in changes:
            try:
                damaged = replaced(damaged, where, value)
            except (KeyError, IndexError, TypeError):  # an earlier change removed the path
                pass
        torch.save(damaged, out / TRAIN_STATE_FILE)
        one_line_or_success(lambda: resume(out, run, model))

    try:
        read()
    finally:
        torch.save(state, out / TRAIN_STATE_FILE)
