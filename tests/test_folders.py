"""Nothing read from outside the folder the user named, limits under every name, and `fca data checkpoints`
bounded and link-free (issue 23, classes 2 and 3): each attack is built in tmp_path and refused with one line
before any file outside is read."""

import io
import json
import shutil
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers
from conftest import assert_one_line_error, fca

from fca_workbench.foundation.errors import UserError

# ----------------------------------------------------------------------------------------------------------
# Foreign models, tokenizers, native checkpoints: every file from inside the folder


@pytest.fixture(scope="module")
def sharded(tiny_mixtral, tmp_path_factory):
    """The tiny Mixtral saved in several safetensors shards, and the same shapes with other weights."""
    root = tmp_path_factory.mktemp("sharded")
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_mixtral)
    model.save_pretrained(root / "mine", max_shard_size="400KB")
    with torch.no_grad():
        for param in model.parameters():
            param.add_(1.0)
    model.save_pretrained(root / "other", max_shard_size="400KB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_mixtral / name, root / "mine" / name)
    index = json.loads((root / "mine" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 2
    return root


@pytest.fixture
def attack(sharded, tmp_path):
    """A fresh copy of the sharded folder (``ckpt``) beside ``other``, a shard of other weights outside it."""
    folder = Path(shutil.copytree(sharded / "mine", tmp_path / "ckpt"))
    outside = Path(shutil.copytree(sharded / "other", tmp_path / "other"))
    return folder, outside


@pytest.fixture
def transformers_reads_nothing(monkeypatch):
    """Fail the test if transformers opens the folder at all: every check comes before it."""

    def forbidden(*args, **kwargs):
        raise AssertionError("transformers was asked to read the folder")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", forbidden)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", forbidden)


def last_shard(folder: Path) -> str:
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    return sorted(set(index["weight_map"].values()))[-1]


def point_index_at(folder: Path, shard: str, name: str) -> None:
    path = folder / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    index["weight_map"] = {k: (name if v == shard else v) for k, v in index["weight_map"].items()}
    path.write_text(json.dumps(index))


INDEX_PLACES = {
    "relative ..": lambda folder, outside, shard: f"../{outside.name}/{shard}",
    "absolute": lambda folder, outside, shard: str(outside / shard),
    "symlink": lambda folder, outside, shard: (
        (folder / "link.safetensors").symlink_to(outside / shard) or "link.safetensors"
    ),
    "folder symlink": lambda folder, outside, shard: (folder / "sub").symlink_to(outside) or f"sub/{shard}",
}


@pytest.mark.parametrize("place", sorted(INDEX_PLACES))
def test_foreign_index_naming_a_shard_outside_is_refused_before_transformers_reads(
    attack, place, transformers_reads_nothing
):
    """The outside shard holds other weights: loading it would give another NLL, without a word (today)."""
    from fca_workbench.adapters.controlled import load_controlled

    folder, outside = attack
    shard = last_shard(folder)
    (folder / shard).unlink()
    point_index_at(folder, shard, INDEX_PLACES[place](folder, outside, shard))
    with pytest.raises(UserError, match="points outside the folder") as error:
        load_controlled(folder)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "generation_config.json", "tokenizer.json"])
def test_foreign_file_linked_from_outside_is_refused(tiny_mixtral, tmp_path, name, transformers_reads_nothing):
    from fca_workbench.adapters.controlled import load_controlled

    folder = Path(shutil.copytree(tiny_mixtral, tmp_path / "ckpt"))
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    if not (folder / name).exists():
        (folder / name).write_text("{}")
    (folder / name).replace(outside / name)
    (folder / name).symlink_to(outside / name)
    with pytest.raises(UserError, match=f"{name} in .* points outside the folder") as error:
        load_controlled(folder)
    assert "\n" not in str(error.value)


def test_unresolvable_names_are_one_line(attack, transformers_reads_nothing):
    from fca_workbench.adapters.controlled import load_controlled

    folder, _ = attack
    point_index_at(folder, last_shard(folder), "shard\x00.safetensors")
    with pytest.raises(UserError, match="cannot be resolved"):
        load_controlled(folder)
    (folder / "loop").symlink_to(folder / "loop")
    with pytest.raises(UserError, match="loop in .* (cannot be resolved|points outside)"):
        load_controlled(folder)


def test_foreign_index_outside_is_one_line_from_the_cli(attack, tmp_path):
    folder, outside = attack
    shard = last_shard(folder)
    (folder / shard).unlink()
    point_index_at(folder, shard, f"../{outside.name}/{shard}")
    result = fca("audit", folder, "--out", tmp_path / "out", "--max-windows", 2)
    assert_one_line_error(result, "points outside the folder")
    assert not (tmp_path / "out" / "audit.json").exists()


def test_foreign_sharded_folder_inside_still_loads_with_its_own_weights(attack, tiny_mixtral):
    from fca_workbench.adapters.controlled import load_controlled

    folder, _ = attack
    loaded = load_controlled(folder).model.state_dict()
    reference = transformers.AutoModelForCausalLM.from_pretrained(tiny_mixtral).state_dict()
    assert loaded.keys() == reference.keys()
    assert all(torch.equal(loaded[k], reference[k]) for k in reference)


def test_foreign_hub_snapshot_with_blob_symlinks_still_loads(sharded, tmp_path):
    from fca_workbench.adapters.controlled import load_controlled

    snapshot, blobs = tmp_path / "models--x" / "snapshots" / "abc123", tmp_path / "models--x" / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for n, path in enumerate(sorted((sharded / "mine").iterdir())):
        (blobs / f"blob{n}").write_bytes(path.read_bytes())
        (snapshot / path.name).symlink_to(Path("../../blobs") / f"blob{n}")
    assert sum(p.numel() for p in load_controlled(snapshot).model.parameters()) > 0


@pytest.mark.parametrize(
    "auto_map",
    [
        {"AutoModelForCausalLM": "/tmp/planted--modeling.Model"},
        {"AutoTokenizer": [None, "other/repo--tokenization.Tok"]},
        ["modeling.Model"],
    ],
)
def test_remote_code_from_outside_the_folder_is_refused(tiny_mixtral, tmp_path, auto_map, transformers_reads_nothing):
    """Even with --trust-remote-code, only the folder's own code: ``repo--module.Class`` names code elsewhere."""
    from fca_workbench.adapters.controlled import load_controlled

    folder = Path(shutil.copytree(tiny_mixtral, tmp_path / "ckpt"))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "auto_map": auto_map}))
    with pytest.raises(UserError, match="auto_map"):
        load_controlled(folder, trust_remote_code=True)


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json", "config.json"])
def test_tokenizer_file_linked_from_outside_is_refused(tiny_mixtral, tmp_path, name):
    from fca_workbench.data.tokenizer import load_tokenizer

    folder = Path(shutil.copytree(tiny_mixtral, tmp_path / "ckpt"))
    (folder / name).replace(tmp_path / name)
    (folder / name).symlink_to(tmp_path / name)
    with pytest.raises(UserError, match=f"{name} in .* points outside the folder"):
        load_tokenizer(folder)


def test_tokenizer_file_linked_out_of_a_subfolder_is_refused(tiny_mixtral, tmp_path):
    from fca_workbench.data.tokenizer import load_tokenizer

    folder = Path(shutil.copytree(tiny_mixtral, tmp_path / "ckpt"))
    (folder / "additional_chat_templates").mkdir()
    (tmp_path / "secret.jinja").write_text("{{ secret }}")
    (folder / "additional_chat_templates" / "x.jinja").symlink_to(tmp_path / "secret.jinja")
    with pytest.raises(UserError, match="additional_chat_templates/x.jinja in .* points outside the folder"):
        load_tokenizer(folder)


def test_native_config_linked_from_outside_is_refused(tiny_checkpoints, tmp_path):
    from fca_workbench.models import load_model

    folder = Path(shutil.copytree(tiny_checkpoints["dense"], tmp_path / "ckpt"))
    (folder / "config.json").replace(tmp_path / "config.json")
    (folder / "config.json").symlink_to(tmp_path / "config.json")
    with pytest.raises(UserError, match="config.json in .* points outside the folder"):
        load_model(folder)


def test_links_that_stay_inside_the_folder_are_fine(tiny_checkpoints, tmp_path):
    from fca_workbench.data.tokenizer import load_tokenizer
    from fca_workbench.models import load_model

    folder = Path(shutil.copytree(tiny_checkpoints["dense"], tmp_path / "ckpt"))
    (folder / "store").mkdir()
    (folder / "tokenizer.json").replace(folder / "store" / "tokenizer.json")
    (folder / "tokenizer.json").symlink_to(Path("store") / "tokenizer.json")
    assert len(load_tokenizer(folder)) > 0
    assert sum(p.numel() for p in load_model(folder).parameters()) > 0


# ----------------------------------------------------------------------------------------------------------
# Limits under every name: transformers' attribute_map aliases, per-layer lists, sub-configs


def foreign_folder(tmp_path: Path, tiny_mixtral: Path, config: dict) -> Path:
    """A planted config.json beside real (never read) safetensors weights."""
    folder = tmp_path / "planted"
    folder.mkdir()
    shutil.copy(tiny_mixtral / "model.safetensors", folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    "model_type, field",
    [
        ("gpt2", "n_layer"),
        ("gpt2", "num_hidden_layers"),  # the alias given under transformers' own name
        ("mpt", "n_layers"),
        ("bloom", "n_layer"),
        ("gptj", "n_layer"),
        ("dbrx", "max_seq_len"),
        ("gpt2", "n_positions"),
    ],
)
def test_sizes_under_a_familys_own_name_are_refused_before_building(
    tiny_mixtral, tmp_path, model_type, field, nothing_built
):
    from fca_workbench.adapters.controlled import load_controlled

    folder = foreign_folder(
        tmp_path, tiny_mixtral, {"model_type": model_type, field: 10**6 if "layer" in field else 10**9}
    )
    with pytest.raises(UserError, match=f"config.json: {field}=10+ is out of range") as error:
        load_controlled(folder)
    assert "\n" not in str(error.value)


def test_a_sub_configs_sizes_are_checked(tiny_mixtral, tmp_path):
    from fca_workbench.adapters.controlled import load_controlled

    folder = foreign_folder(
        tmp_path, tiny_mixtral, {"model_type": "gemma3n", "text_config": {"num_hidden_layers": 10**6}}
    )
    with pytest.raises(UserError, match=r"text_config\.num_hidden_layers=1000000 is out of range"):
        load_controlled(folder)


def never_built(monkeypatch) -> list:
    """Make building any transformers model (on the meta device too) a recorded failure; the list of the
    configs someone tried to build."""
    tried: list = []

    def build(config, *args, **kwargs):
        tried.append(config)
        raise AssertionError(f"built a {type(config).__name__} model")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", build)
    return tried


def test_train_refuses_an_aliased_size_of_an_hf_config_before_building(tmp_path, monkeypatch, capsys):
    from fca_workbench.cli import main

    (tmp_path / "gpt2.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 10**6}))
    tried = never_built(monkeypatch)
    args = [
        "train",
        "--hf-config",
        tmp_path / "gpt2.json",
        "--train",
        tmp_path / "missing.txt",
        "--out",
        tmp_path / "run",
    ]
    assert main([str(a) for a in args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "fca train's --hf-config: n_layer=1000000 is out of range" in lines[0], lines
    assert tried == []  # refused before any model was built, not even on the meta device
    assert not (tmp_path / "run").exists()


def test_train_refuses_mpt_layers_before_building(monkeypatch):
    from fca_workbench.data.tokenizer import load_tokenizer
    from fca_workbench.training.hf_config import build_hf_model

    tried = never_built(monkeypatch)
    with pytest.raises(UserError, match="n_layers=1000000 is out of range"):
        build_hf_model({"model_type": "mpt", "n_layers": 10**6}, load_tokenizer(), 64)
    assert tried == []


def test_per_layer_sizes_are_checked_element_wise():
    """Gemma3n gives ``intermediate_size`` per layer: a list of sane sizes passes, one absurd element does not."""
    from fca_workbench.models.limits import HF_SIZE_LIMITS, check_fields, check_sizes

    config = transformers.AutoConfig.for_model("gemma3n_text")
    assert isinstance(config.intermediate_size, list)
    check_sizes(config, "gemma3n", HF_SIZE_LIMITS, none_allowed=True)
    check_fields(config.to_dict(), type(config), "gemma3n", HF_SIZE_LIMITS, none_allowed=True)
    sizes = [64] * 4
    sizes[3] = 10**9
    with pytest.raises(UserError, match=r"intermediate_size\[3\]=1000000000 is out of range"):
        check_fields({"intermediate_size": sizes}, type(config), "gemma3n", HF_SIZE_LIMITS, none_allowed=True)
    with pytest.raises(UserError, match=r"intermediate_size\[0\]='64' is out of range"):
        check_sizes(SimpleNamespace(intermediate_size=["64"]), "gemma3n", HF_SIZE_LIMITS, none_allowed=True)


def test_every_causal_lms_default_config_passes_the_limits():
    """The limits refuse only the absurd: no default config of a transformers causal LM is refused."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from fca_workbench.models.limits import HF_SIZE_LIMITS, check_fields, check_sizes

    checked = 0
    for model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        try:
            config = CONFIG_MAPPING[model_type]()
        except Exception:  # a few need arguments, or packages not installed here
            continue
        check_sizes(config, model_type, HF_SIZE_LIMITS, none_allowed=True)
        check_fields(config.to_dict(), type(config), model_type, HF_SIZE_LIMITS, none_allowed=True)
        checked += 1
    assert checked > 100


# ----------------------------------------------------------------------------------------------------------
# fca data checkpoints: no links followed, a private temporary folder, bounded, every error one line


def sdist_with(path: Path, members: list[tuple[str, bytes | None]], mode: str = "w:gz") -> Path:
    """A tar archive of ``members`` (name, bytes; None: a folder) under ``fca_workbench-0.1.0/``."""
    with tarfile.open(path, mode) as archive:
        for name, payload in members:
            info = tarfile.TarInfo(f"fca_workbench-0.1.0/{name}")
            if payload is None:
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
            else:
                info.size = len(payload)
                archive.addfile(info, io.BytesIO(payload))
    return path


CKPT = "data/checkpoints/m"


def entries(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def source_with_link(tmp_path: Path, link_to_folder: bool = False) -> Path:
    source = tmp_path / "src"
    (source / CKPT).mkdir(parents=True)
    (source / CKPT / "config.json").write_text("{}")
    secret = tmp_path / "shadow"
    if link_to_folder:
        secret.mkdir()
        (secret / "passwords").write_text("SECRET")
    else:
        secret.write_text("SECRET")
    (source / CKPT / "weights").symlink_to(secret)
    return source


@pytest.mark.parametrize("link_to_folder", [False, True])
def test_copy_from_a_folder_never_follows_a_link(tmp_path, link_to_folder):
    from fca_workbench.foundation.resources import copy_checkpoints

    source = source_with_link(tmp_path, link_to_folder)
    before = entries(tmp_path)
    with pytest.raises(UserError, match="weights is a link") as error:
        copy_checkpoints(source, tmp_path / "into")
    assert "\n" not in str(error.value)
    assert entries(tmp_path) == before  # nothing copied in, no temporary folder left


def test_copy_from_a_folder_refuses_a_special_file_before_copying(tmp_path):
    """A named pipe (or a device) reads without end, or blocks: refused, nothing written."""
    import os

    from fca_workbench.foundation.resources import copy_checkpoints

    source = tmp_path / "src"
    (source / CKPT).mkdir(parents=True)
    (source / CKPT / "config.json").write_text("{}")
    os.mkfifo(source / CKPT / "model.safetensors")
    with pytest.raises(UserError, match="model.safetensors is not a regular file"):
        copy_checkpoints(source, tmp_path / "into")
    assert entries(tmp_path) == ["src", "src/data", "src/data/checkpoints", "src/data/checkpoints/m"] + [
        f"src/{CKPT}/{name}" for name in ("config.json", "model.safetensors")
    ]


def test_copy_from_a_folder_with_a_link_is_one_line_from_the_cli(tmp_path):
    source = source_with_link(tmp_path)
    result = fca("data", "checkpoints", "--from", source, "--into", tmp_path / "into")
    assert_one_line_error(result, "is a link")
    assert not (tmp_path / "into").exists()


def test_copy_writes_into_a_fresh_private_folder_not_a_predictable_sibling(tmp_path, monkeypatch):
    import fca_workbench.foundation.resources as resources

    sdist = sdist_with(tmp_path / "s.tar.gz", [(f"{CKPT}/config.json", b"{}")])
    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp_path / ".into.tmp").symlink_to(victim)  # planted where a predictable sibling would be
    staged = []
    extract = resources.extract_checkpoints

    def spy(archive: Path, folder: Path) -> None:
        staged.append((folder, folder.stat().st_mode & 0o777, folder.is_symlink()))
        extract(archive, folder)

    monkeypatch.setattr(resources, "extract_checkpoints", spy)
    assert resources.copy_checkpoints(sdist, tmp_path / "into") == ["m"]
    ((folder, mode, is_link),) = staged
    assert folder.parent == tmp_path and folder.name != ".into.tmp" and not is_link
    assert mode == 0o700  # private while it is filled
    assert list(victim.iterdir()) == [] and (tmp_path / ".into.tmp").is_symlink()
    assert entries(tmp_path / "into") == ["m", "m/config.json"]


def test_an_archive_declaring_more_than_the_cap_is_refused_before_writing(tmp_path, monkeypatch):
    import fca_workbench.foundation.resources as resources

    monkeypatch.setattr(resources, "CHECKPOINTS_MAX_BYTES", 1 << 20, raising=False)
    sdist = sdist_with(tmp_path / "s.tar.gz", [(f"{CKPT}/config.json", b"{}"), (f"{CKPT}/zeros", bytes(3 << 20))])
    assert sdist.stat().st_size < 20_000  # a small archive expanding to 3 MiB
    written = []
    monkeypatch.setattr(tarfile.TarFile, "extractall", lambda *a, **k: written.append(a))
    with pytest.raises(UserError, match="more than the 1,048,576 bytes") as error:
        resources.copy_checkpoints(sdist, tmp_path / "into")
    assert "\n" not in str(error.value) and not written
    assert entries(tmp_path) == ["s.tar.gz"]


def test_a_small_archive_expanding_to_a_gigabyte_is_refused_at_once(tmp_path, monkeypatch):
    """1 MB of gzip holding 1.1 GB of zeros (gzip members concatenated, as gzip allows) under the real cap:
    refused at the oversized member's header, without reading (decompressing) past it to a third one."""
    import gzip

    from fca_workbench.foundation.resources import copy_checkpoints

    config = tarfile.TarInfo(f"fca_workbench-0.1.0/{CKPT}/config.json")
    config.size = 2
    big = tarfile.TarInfo(f"fca_workbench-0.1.0/{CKPT}/model.safetensors")
    big.size = 1100 << 20
    head = config.tobuf() + b"{}".ljust(tarfile.BLOCKSIZE, b"\0") + big.tobuf()
    zeros = gzip.compress(bytes(1 << 20), mtime=0)
    sdist = tmp_path / "s.tar.gz"
    sdist.write_bytes(gzip.compress(head, mtime=0) + zeros * 1100 + gzip.compress(bytes(2 * tarfile.BLOCKSIZE)))
    assert sdist.stat().st_size < 4 << 20
    headers = []
    next_header = tarfile.TarFile.next
    monkeypatch.setattr(tarfile.TarFile, "next", lambda self: headers.append(next_header(self)) or headers[-1])
    with pytest.raises(UserError, match="take at least 1,153,433,602 bytes"):
        copy_checkpoints(sdist, tmp_path / "into")
    assert None not in headers and headers[-1].name == big.name  # the end of the archive never reached
    assert entries(tmp_path) == ["s.tar.gz"]


def test_an_archive_of_too_many_files_is_refused_before_writing(tmp_path, monkeypatch):
    import fca_workbench.foundation.resources as resources

    monkeypatch.setattr(resources, "CHECKPOINTS_MAX_FILES", 50, raising=False)
    members = [(f"{CKPT}/config.json", b"{}")] + [(f"{CKPT}/empty{n}", b"") for n in range(60)]
    sdist = sdist_with(tmp_path / "s.tar.gz", members)
    with pytest.raises(UserError, match="51 files and folders, more than"):
        resources.copy_checkpoints(sdist, tmp_path / "into")
    assert entries(tmp_path) == ["s.tar.gz"]


def test_a_source_whose_checkpoints_folder_links_elsewhere_is_refused(tmp_path):
    from fca_workbench.foundation.resources import copy_checkpoints

    elsewhere = tmp_path / "elsewhere" / "m"
    elsewhere.mkdir(parents=True)
    (elsewhere / "config.json").write_text("{}")
    (tmp_path / "src" / "data").mkdir(parents=True)
    (tmp_path / "src" / "data" / "checkpoints").symlink_to(elsewhere.parent)
    with pytest.raises(UserError, match="--from in .* points outside the folder"):
        copy_checkpoints(tmp_path / "src", tmp_path / "into")
    assert not (tmp_path / "into").exists()


def test_a_truncated_sdist_is_one_line_and_leaves_nothing(tmp_path):
    from fca_workbench.foundation.resources import copy_checkpoints

    payload = torch.randint(0, 256, (400_000,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    sdist = sdist_with(
        tmp_path / "s.tar.gz",
        [(f"{CKPT}/config.json", b"{}"), (f"{CKPT}/model.safetensors", payload.numpy().tobytes())],
    )
    sdist.write_bytes(sdist.read_bytes()[: sdist.stat().st_size // 2])
    with pytest.raises(UserError, match="damaged or truncated") as error:
        copy_checkpoints(sdist, tmp_path / "into")
    assert "\n" not in str(error.value)
    assert entries(tmp_path) == ["s.tar.gz"]


def test_a_plain_tar_cut_between_two_members_is_one_line_and_leaves_nothing(tmp_path):
    """tarfile reads such a file as a shorter archive: here the second checkpoint would be missing silently."""
    from fca_workbench.foundation.resources import copy_checkpoints

    members = [(f"{CKPT}/config.json", b"{}"), ("data/checkpoints/n/config.json", b"{}")]
    sdist = sdist_with(tmp_path / "s.tar", members, mode="w")
    with tarfile.open(sdist) as archive:
        second = archive.getmember("fca_workbench-0.1.0/data/checkpoints/n/config.json").offset
    assert copy_checkpoints(sdist, tmp_path / "whole") == ["m", "n"]
    sdist.write_bytes(sdist.read_bytes()[:second])
    with tarfile.open(sdist) as archive:
        assert len(archive.getmembers()) == 1  # what tarfile makes of it, without a word
    with pytest.raises(UserError, match="without the end-of-archive block: truncated") as error:
        copy_checkpoints(sdist, tmp_path / "into")
    assert "\n" not in str(error.value)
    assert entries(tmp_path) == ["s.tar", "whole", "whole/m", "whole/m/config.json", "whole/n", "whole/n/config.json"]


@pytest.mark.parametrize(
    "members",
    [
        [(f"{CKPT}/config.json", b"{}"), (f"{CKPT}/weights", b"x"), (f"{CKPT}/weights/inner", b"y")],
        [(f"{CKPT}/config.json", b"{}"), (f"{CKPT}/weights", None), (f"{CKPT}/weights", b"x")],
    ],
    ids=["file then folder", "folder then file"],
)
def test_a_member_colliding_with_a_folder_is_one_line(tmp_path, members):
    from fca_workbench.foundation.resources import copy_checkpoints

    sdist = sdist_with(tmp_path / "s.tar.gz", members)
    with pytest.raises(UserError, match="cannot extract the checkpoints") as error:
        copy_checkpoints(sdist, tmp_path / "into")
    assert "\n" not in str(error.value)
    assert entries(tmp_path) == ["s.tar.gz"]


def test_a_link_member_in_the_sdist_is_refused(tmp_path):
    from fca_workbench.foundation.resources import copy_checkpoints

    sdist = tmp_path / "s.tar.gz"
    with tarfile.open(sdist, "w:gz") as archive:
        config = tarfile.TarInfo(f"fca_workbench-0.1.0/{CKPT}/config.json")
        config.size = 2
        archive.addfile(config, io.BytesIO(b"{}"))
        link = tarfile.TarInfo(f"fca_workbench-0.1.0/{CKPT}/model.safetensors")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/shadow"
        archive.addfile(link)
    with pytest.raises(UserError, match="model.safetensors in .* is a link"):
        copy_checkpoints(sdist, tmp_path / "into")
    assert entries(tmp_path) == ["s.tar.gz"]


def test_into_below_a_file_is_one_line(tmp_path):
    from fca_workbench.foundation.resources import copy_checkpoints

    sdist = sdist_with(tmp_path / "s.tar.gz", [(f"{CKPT}/config.json", b"{}")])
    (tmp_path / "file").write_text("mine")
    with pytest.raises(UserError, match="cannot write the checkpoints to .*file/into"):
        copy_checkpoints(sdist, tmp_path / "file" / "into")
    assert entries(tmp_path) == ["file", "s.tar.gz"] and (tmp_path / "file").read_text() == "mine"


def test_checkpoints_env_naming_an_unknown_users_home_is_one_line(monkeypatch):
    from fca_workbench.foundation.resources import CHECKPOINTS_ENV, checkpoints_dir

    monkeypatch.setenv(CHECKPOINTS_ENV, "~nosuchuser/x")
    with pytest.raises(
        UserError, match="FCA_CHECKPOINTS=~nosuchuser/x names a home folder that does not exist"
    ) as error:
        checkpoints_dir()
    assert "\n" not in str(error.value)


def test_checkpoints_env_naming_an_unknown_users_home_is_one_line_from_the_cli(tmp_path, monkeypatch):
    monkeypatch.setenv("FCA_CHECKPOINTS", "~nosuchuser/x")
    result = fca("reproduce", "--out", tmp_path / "out")
    assert_one_line_error(result, "FCA_CHECKPOINTS=~nosuchuser/x names a home folder that does not exist")
    assert not (tmp_path / "out").exists()
