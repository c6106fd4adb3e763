"""The checkpoint folder: the names of its files, a checkpoint as the user names it resolved to a checked folder,
and its config's fields read before anything is built from them.

A checkpoint is named as a folder, or as a Hugging Face hub name ``ORG/NAME[@REVISION]``, resolved the way
transformers resolves one: the local cache (``HF_HOME`` / ``HF_HUB_CACHE``) first, a download through
``huggingface_hub`` only while the network is allowed (``HF_HUB_OFFLINE`` unset), and only configs, safetensors
and tokenizer files (code files only with ``--trust-remote-code``). An existing folder always stays a folder (a
folder ``org/name`` in the current folder wins, as in transformers). What comes back is a ``Checkpoint``: a
folder that holds a ``config.json`` and no link leading out of it, and where it came from.

Every file name of a checkpoint folder is declared here, for the loaders, the trainer, the exporter and the
tokenizer alike. It is a foundation module because ``resources`` (which folders of a copy are checkpoints, what
is never shipped) and ``data.tokenizer`` (a folder's tokenizer files) need the names below ``models``.
"""

import difflib
import hashlib
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from huggingface_hub import constants, get_cached_repo_tree, snapshot_download
from huggingface_hub.errors import (
    HfHubHTTPError,
    HFValidationError,
    IncompleteSnapshotError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
)
from huggingface_hub.file_download import REGEX_COMMIT_HASH, repo_folder_name
from huggingface_hub.utils import filter_repo_objects, validate_repo_id

from fca_workbench.foundation.errors import UserError, first_line
from fca_workbench.foundation.files import (
    canonical_json,
    check_links_inside,
    inside_folder,
    read_json,
    read_text,
    relative_path,
    schema_problem,
)

CONFIG_FILE = "config.json"  # what makes a folder a checkpoint folder
GENERATION_CONFIG_FILE = "generation_config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"  # a sharded model's shards, by tensor
BIN_FILE = "pytorch_model.bin"
BIN_INDEX = "pytorch_model.bin.index.json"
SAFETENSORS_WEIGHTS = (SAFETENSORS_FILE, SAFETENSORS_INDEX)  # what a foreign model loads from: safetensors only
WEIGHT_FILES = (*SAFETENSORS_WEIGHTS, BIN_FILE, BIN_INDEX)  # what the strict loader reads, in transformers' order
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
CARD_FILE = "README.md"  # the model card, as the hub shows it
TRAIN_CARD_FILE = "model_card.json"  # fca train's card: the command that trains it again, what it reached
TRAIN_LOG_FILE = "train_log.csv"  # fca train's loss, one row per step
TRAIN_STATE_FILE = "trainer_state.pt"  # an unfinished fca train run's whole state; never shipped

# What a download fetches: configs (and shard indexes), weights, tokenizer files; never code or other formats.
HUB_FILES = ("*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken")
CODE_FILES = ("*.py",)  # fetched only with --trust-remote-code
HUB_NAME = re.compile(r"[^/@~.\\][^/@\\]*/[^/@\\]+(@.*)?", re.DOTALL)  # ORG/NAME[@REVISION], validated below
REVISION = re.compile(r"[\w.\-]+(/[\w.\-]+)*")  # a branch, tag or commit; refs/pr/1 too
MAX_REVISION = 255  # the cache keeps refs/<revision> as a file: longer is no name a file system takes


def is_checkpoint(folder: Path) -> bool:
    """True for a folder that holds a checkpoint's ``config.json`` (its weights are checked when loaded)."""
    return (Path(folder) / CONFIG_FILE).is_file()


def check_checkpoint(path: str | Path) -> Path:
    """The checkpoint folder ``path``, or a one-line ``UserError`` saying it is missing or is not one: the
    check every command and loader makes before reading a checkpoint."""
    folder = Path(path)
    if not folder.is_dir():
        raise UserError(f"checkpoint folder not found: {folder}")
    if not is_checkpoint(folder):
        raise UserError(f"not a checkpoint folder (no {CONFIG_FILE}): {folder}")
    check_links_inside(folder)
    return folder


@dataclass(frozen=True)
class Checkpoint:
    """A checked checkpoint folder; for a hub name, also the id, the revision asked and the commit it is."""

    folder: Path
    hub_id: str | None = None
    revision: str | None = None  # as asked; None: the repository's default branch
    commit: str | None = None  # the snapshot's commit sha

    def provenance(self) -> dict | None:
        """What ``audit.json`` records as ``model.hub``: None for a plain folder."""
        if self.hub_id is None:
            return None
        return {"id": self.hub_id, "revision": self.revision, "commit": self.commit}

    def record(self, relative_to: Path | None = None) -> dict:
        """Where an artifact's model came from, as ``audit.json``, ``downstream.json`` and an export's card all
        record it: the folder loaded (``relative_to`` a folder, for a card that travels with its folder) and
        ``provenance``, the hub id and commit where it came from the hub."""
        path = str(self.folder.resolve()) if relative_to is None else relative_path(self.folder, relative_to)
        return {"path": path, "hub": self.provenance()}


CONFIG_METADATA = ("transformers_version", "_name_or_path", "dtype", "torch_dtype")  # how a config was saved, not what
RUN_ONLY = ("seed",)  # a training setting that makes another run of the same configuration


def configuration(config: dict, training: dict | None = None) -> str:
    """sha256 of what makes models seeds of one configuration: the model config less how it was saved, and the
    training settings less the seed. Two audits with the same digest may be averaged over seeds; two without may
    not, whatever their architecture."""
    kept = {
        "config": {k: v for k, v in config.items() if k not in CONFIG_METADATA},
        "training": None if training is None else {k: v for k, v in training.items() if k not in RUN_ONLY},
    }
    return hashlib.sha256(canonical_json(kept).encode()).hexdigest()


def folder_configuration(folder: Path) -> str:
    """``configuration`` of a checkpoint folder: its config.json, and the settings of fca train's card where the
    folder has one (a foreign checkpoint's training is unknown, so only its config counts)."""
    config = read_json(folder / CONFIG_FILE)
    card = read_json(folder / TRAIN_CARD_FILE) if (folder / TRAIN_CARD_FILE).is_file() else {}
    assert isinstance(config, dict) and isinstance(card, dict)  # read_json's default: an object
    training = card.get("settings")
    return configuration(config, training if isinstance(training, dict) else None)


def hub_name(name: str | Path) -> tuple[str, str | None] | None:
    """``(id, revision)`` when ``name`` is a hub name, None when it names a folder (a ``Path``, an existing
    path, or text not shaped ``ORG/NAME[@REVISION]``); a malformed hub name is one ``UserError`` line."""
    if isinstance(name, Path) or not HUB_NAME.fullmatch(name) or os.path.lexists(name):
        return None
    repo_id, _, revision = name.partition("@")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise UserError(f"{name!r} is neither a folder nor a valid hub name: {first_line(exc)}") from None
    if "@" in name and (not REVISION.fullmatch(revision) or ".." in revision or len(revision) > MAX_REVISION):
        raise UserError(f"{name!r}: the revision {revision!r} is not a branch, tag or commit name")
    return repo_id, revision or None


def checkpoint_key(name: str | Path) -> str:
    """What tells checkpoints apart, without looking anything up: a hub name as given, else the resolved path."""
    return str(name) if hub_name(name) else str(Path(name).resolve())


def checkpoint_name(name: str | Path) -> str:
    """A name for ``name`` safe as a file name and a label: a folder's own name, ``org--name[@revision]`` for a
    hub name (``/`` in a revision as ``--``), without looking anything up."""
    parsed = hub_name(name)
    return Path(name).resolve().name if parsed is None else _hub_label(*parsed)


def recorded_name(model: dict) -> str:
    """``checkpoint_name`` of the checkpoint an ``audit.json``'s ``model`` record was computed from."""
    hub = model.get("hub")
    return _hub_label(hub["id"], hub["revision"]) if hub else Path(model["path"]).name


def _hub_label(repo_id: str, revision: str | None) -> str:
    return repo_id.replace("/", "--") + (f"@{revision.replace('/', '--')}" if revision else "")


# What keeps huggingface_hub, transformers and the kernels package from the network: offline mode (every
# request through huggingface_hub refused before it is sent: the kernels' publisher checks when a modelling
# module is imported, the agent-harness registry), no telemetry, no hub kernels.
NO_REQUESTS = {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "USE_HUB_KERNELS": "NO"}
KERNELS_LOG = logging.getLogger("kernels")
_replaced: dict | None = None  # what ``hub_requests(False)`` replaced, put back by ``hub_requests(True)``


def hub_requests(allowed: bool) -> None:
    """Allow requests to the Hugging Face hub (a hub id was asked for: the user's own settings) or not (a
    local folder or file: no request to any host). Both the environment (read by the libraries at each call,
    and by subprocesses) and huggingface_hub's constants (read once, when it was imported) are set; allowing
    puts back only what still holds the value set here (a setting changed since is the caller's)."""
    global _replaced
    if not allowed and _replaced is None:
        _replaced = {name: os.environ.get(name) for name in NO_REQUESTS}
        _replaced.update(offline=constants.HF_HUB_OFFLINE, telemetry=constants.HF_HUB_DISABLE_TELEMETRY)
        _replaced.update(kernels=KERNELS_LOG.level)
        os.environ.update(NO_REQUESTS)
        constants.HF_HUB_OFFLINE = constants.HF_HUB_DISABLE_TELEMETRY = True
        KERNELS_LOG.setLevel(logging.ERROR)  # each kernel transformers looks for: "skipping ... offline mode"
    elif allowed and _replaced is not None:
        for name, value in NO_REQUESTS.items():
            if os.environ.get(name) == value and _replaced[name] is None:
                del os.environ[name]
            elif os.environ.get(name) == value:
                os.environ[name] = _replaced[name]
        if constants.HF_HUB_OFFLINE is True:
            constants.HF_HUB_OFFLINE = _replaced["offline"]
        if constants.HF_HUB_DISABLE_TELEMETRY is True:
            constants.HF_HUB_DISABLE_TELEMETRY = _replaced["telemetry"]
        if KERNELS_LOG.level == logging.ERROR:
            KERNELS_LOG.setLevel(_replaced["kernels"])
        _replaced = None


def resolve_checkpoint(name: str | Path, trust_remote_code: bool = False) -> Checkpoint:
    """The checkpoint ``name`` names, checked (``check_checkpoint``: no link leading out of it, a hub snapshot's
    links into its own ``blobs/`` aside); every way it cannot be found is one ``UserError`` line. A folder turns
    requests to the hub off (``hub_requests``), a hub name back on as the environment has them."""
    parsed = hub_name(name)
    hub_requests(parsed is not None)
    if parsed is None:
        return Checkpoint(check_checkpoint(name))
    repo_id, revision = parsed
    patterns = [*HUB_FILES, *(CODE_FILES if trust_remote_code else ())]
    offline = constants.HF_HUB_OFFLINE
    how = "HF_HUB_OFFLINE is set" if offline else "the hub cannot be reached"
    fetch = f"fetch it where the network is allowed: {download_command(repo_id, revision, patterns)}"
    cache = Path(os.path.normpath(constants.HF_HUB_CACHE)).resolve()
    storage = cache / repo_folder_name(repo_id=repo_id, repo_type=constants.REPO_TYPE_MODEL)
    check_cache_files(storage, repo_id, revision)
    try:
        fetched = snapshot_download(repo_id, revision=revision, allow_patterns=patterns, local_files_only=offline)
    except IncompleteSnapshotError as exc:
        missing = missing_files(repo_id, Path(exc.snapshot_path), patterns)
        raise UserError(
            f"{missing} missing from the cached snapshot of {name} ({exc.snapshot_path}) and {how}; {fetch}"
        ) from None
    except LocalEntryNotFoundError:
        close = closest_cached(repo_id, cache)
        raise UserError(
            f"{name} is neither a folder nor in the Hugging Face cache ({constants.HF_HUB_CACHE}) and {how}; "
            + (f"did you mean {close}? If not, {fetch}" if close else fetch)
        ) from None
    except RepositoryNotFoundError as exc:
        close = closest_cached(repo_id, cache)
        raise UserError(
            f"cannot fetch {name} from the Hugging Face hub: {first_line(exc)}"
            + (f"; did you mean {close}?" if close else "")
        ) from None
    except (HfHubHTTPError, HFValidationError, OSError, ValueError) as exc:  # gated, revision unknown
        raise UserError(f"cannot fetch {name} from the Hugging Face hub: {first_line(exc)}") from None
    snapshot = Path(os.path.normpath(fetched))
    if snapshot.parent != storage / "snapshots" or not REGEX_COMMIT_HASH.fullmatch(snapshot.name):
        raise UserError(f"the Hugging Face cache of {repo_id} points outside its own folder ({snapshot})")
    if snapshot.resolve() != storage.resolve() / "snapshots" / snapshot.name:  # a link to another folder
        raise UserError(
            f"the cached snapshot {snapshot} of {repo_id} is a link to {snapshot.resolve()}, not a folder of "
            "its own cache; refusing to read a checkpoint from elsewhere"
        )
    return Checkpoint(check_checkpoint(snapshot), repo_id, revision, snapshot.name)


def download_command(repo_id: str, revision: str | None, patterns: list[str]) -> str:
    """The ``hf download`` command that fetches what ``resolve_checkpoint`` reads of a hub repository."""
    asked = f" --revision {revision}" if revision else ""
    return f"hf download {repo_id}{asked} --include " + " ".join(f"'{p}'" for p in patterns)


REF_MAX_BYTES = 4096  # a ref holds one 40-character commit hash
TREE_MAX_BYTES = 16 << 20  # a tree listing: ~150 bytes a file, far above any model repository's


def check_cache_files(storage: Path, repo_id: str, revision: str | None) -> None:
    """Read the files huggingface_hub reads from a repository's cache before it does, through the bounded
    readers: the ref the revision names (``refs/<revision>``) must hold a commit hash, every cached tree listing
    (``trees/<sha>.json``) must be an object of the shape it writes, neither a link out of the repository.
    huggingface_hub parses them with a bare ``json.load`` / ``read()`` (a list or deep nesting: a traceback)."""
    what = f"the Hugging Face cache of {repo_id}"
    ref = f"refs/{revision or constants.DEFAULT_REVISION}"
    try:
        if not REGEX_COMMIT_HASH.fullmatch(revision or "") and os.path.lexists(storage / ref):
            commit = read_text(inside_folder(storage, ref, what), REF_MAX_BYTES, "a ref holding a commit hash")
            if not REGEX_COMMIT_HASH.fullmatch(commit):
                raise UserError(f"{storage / ref} holds {commit[:60]!r}, not a commit hash")
        for tree in sorted((storage / "trees").glob("*.json")):
            listing = read_json(inside_folder(storage, f"trees/{tree.name}", what), max_bytes=TREE_MAX_BYTES)
            problem = schema_problem(listing, TREE_SCHEMA)
            if problem:
                raise UserError(f"{tree} is not a tree listing ({problem})")
    except UserError as exc:
        raise UserError(f"{what} is damaged: {exc}") from None


# ``trees/<sha>.json`` as huggingface_hub writes it (``_tree_cache``): a listing of another format version is
# one it ignores, so only version 1's files are held to this shape.
TREE_ENTRY = {
    "type": "object",
    "required": ["size", "blob_id"],
    "properties": {
        "size": {"type": "integer"},
        "blob_id": {"type": "string"},
        "lfs_sha256": {"type": ["string", "null"]},
        "lfs_size": {"type": ["integer", "null"]},
        "xet_hash": {"type": ["string", "null"]},
    },
}
TREE_SCHEMA = {
    "type": "object",
    "if": {"properties": {"format_version": {"const": 1}}, "required": ["format_version"]},
    "then": {"required": ["files"], "properties": {"files": {"type": "object", "additionalProperties": TREE_ENTRY}}},
}


def missing_files(repo_id: str, snapshot: Path, patterns: list[str]) -> str:
    """Which files the cached tree listing of ``snapshot`` names (of those ``patterns`` fetch) and the snapshot
    lacks, as the start of a sentence (``X is``, ``X, Y and 3 more are``)."""
    listed = get_cached_repo_tree(repo_id, revision=snapshot.name)
    names = [f.path for f in filter_repo_objects(listed, allow_patterns=patterns, key=lambda f: f.path)]
    missing = [repr(name)[1:-1][:80] for name in names if not (snapshot / name).is_file()] or ["a file"]
    if len(missing) == 1:
        return f"{missing[0]} is"
    shown = ", ".join(missing[:3])
    return f"{shown} and {len(missing) - 3} more are" if len(missing) > 3 else f"{shown} are"


def closest_cached(repo_id: str, cache: Path) -> str | None:
    """The name of a model repository in the cache closest to ``repo_id`` (a likely typo), if any is close;
    None when ``repo_id`` itself is cached (then its revision is what is missing). Only the folder names are
    read: ``scan_cache_dir`` would read every ref and stat every blob of every repository."""
    prefix = f"{constants.REPO_TYPE_MODEL}s{constants.REPO_ID_SEPARATOR}"
    try:
        folders = [p.name for p in cache.iterdir() if p.name.startswith(prefix)]
    except OSError:
        return None
    cached = [folder.removeprefix(prefix).replace(constants.REPO_ID_SEPARATOR, "/") for folder in folders]
    if repo_id in cached:
        return None
    return next(iter(difflib.get_close_matches(repo_id, cached, n=1)), None)


def config_fields(folder: Path) -> dict:
    """The JSON object in a checkpoint's ``config.json``, as it is; unreadable: one ``UserError`` line."""
    try:
        return cast(dict, read_json(folder / CONFIG_FILE))
    except UserError as exc:
        raise UserError(f"unreadable checkpoint config: {exc}") from None


def model_type_of(raw: dict, folder: Path) -> str | None:
    """A config's ``model_type``: a name, or None when it has none; anything else is one ``UserError`` line."""
    model_type = raw.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise UserError(f"{folder / CONFIG_FILE}: model_type is a JSON {type(model_type).__name__}, not a name")
    return model_type
