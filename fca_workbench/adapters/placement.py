"""Models bigger than one device, through accelerate's big-model inference: ``--device-map``, ``--max-memory``
and ``--offload-folder`` parsed into what ``from_pretrained`` takes, the offload folder made and removed
safely, and where a placed module computes (its weights may sit on ``meta``, streamed in by accelerate's hook).
"""

import argparse
import os
import re
import shutil
import tempfile
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psutil
import torch
from torch import nn

from fca_workbench.foundation import flags
from fca_workbench.foundation.errors import UserError, first_line
from fca_workbench.foundation.files import read_json
from fca_workbench.models.common import execution_device

__all__ = [
    "Placement",
    "execution_device",
    "is_placed",
    "offload_space",
    "placed",
    "placement",
    "tensor_fingerprints",
    "value_devices",
]

DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
GPU_KEY = re.compile(r"^\d+$")
MAP_DEVICE = re.compile(r"^(cpu|disk|cuda(:\d+)?|\d+)$")
OFFLOAD_PREFIX = "fca-offload-"

Loaded = TypeVar("Loaded")
MaxMemory = dict[int | str, int]  # accelerate's max_memory: GPU index or "cpu" -> bytes


@dataclass(frozen=True)
class Placement:
    """What ``from_pretrained`` is given to place a model: a device map (a strategy or module -> device), the
    memory each device may hold, and the folder the rest is offloaded to."""

    device_map: str | dict[str, int | str]
    max_memory: MaxMemory
    offload_folder: Path

    def loading_kwargs(self) -> dict[str, Any]:
        return {
            "device_map": self.device_map,
            "max_memory": self.max_memory,
            "offload_folder": str(self.offload_folder),
        }


def parse_device_map(text: str) -> str | dict[str, int | str]:
    """``auto``, ``balanced``, ``balanced_low_0``, ``sequential``, or a JSON file of module name -> device
    (``cpu``, ``disk``, ``cuda:N`` or a GPU index)."""
    if text in DEVICE_MAP_STRATEGIES:
        return text
    if not text.endswith(".json"):
        raise UserError(f"--device-map {text!r}: give one of {', '.join(DEVICE_MAP_STRATEGIES)} or a FILE.json")
    mapping = read_json(Path(text))
    assert isinstance(mapping, dict)  # read_json's default expect
    for name, device in mapping.items():
        if isinstance(device, bool) or not isinstance(device, (int, str)) or not MAP_DEVICE.match(str(device)):
            raise UserError(
                f"--device-map {text}: module {name[:80]!r} is placed on {str(device)[:40]!r}, not cpu, disk, "
                "cuda:N or a GPU index"
            )
    return mapping


def parse_max_memory(text: str) -> MaxMemory:
    """``cpu=200MB`` or ``0=10GiB,cpu=30GiB``: accelerate's ``max_memory`` (each size ``flags.byte_size``)."""
    memory: MaxMemory = {}
    for entry in text.split(","):
        key, equals, size = (part.strip() for part in entry.partition("="))
        if not equals or not (key == "cpu" or GPU_KEY.match(key)):
            raise UserError(f"--max-memory {text!r}: each entry is DEVICE=SIZE, DEVICE cpu or a GPU index (0=10GiB)")
        device: int | str = int(key) if GPU_KEY.match(key) else key
        if device in memory:
            raise UserError(f"--max-memory {text!r} names {key} twice")
        try:
            memory[device] = flags.byte_size(size)
        except argparse.ArgumentTypeError as exc:
            raise UserError(f"--max-memory {text[:80]!r}: {exc}") from None
    return memory


def device_budget(given: MaxMemory, device: str, torchrun_gpu: int | None) -> MaxMemory:
    """The memory each device may hold: the GPUs ``device`` allows (none for ``cpu``; under torchrun the rank's
    own, ``torchrun_gpu``) and the CPU, each at its ``--max-memory`` size or else its free memory now."""
    gpus = [key for key in given if isinstance(key, int)]
    if gpus and not device.startswith("cuda"):
        raise UserError(f"--max-memory names GPU {gpus[0]}, but --device is {device}: give --device cuda to use GPUs")
    if gpus and torchrun_gpu is not None:
        raise UserError(
            f"--max-memory names GPU {gpus[0]}; under torchrun each rank places its model on its own GPU "
            "(cuda:LOCAL_RANK), the CPU and disk: name only cpu"
        )
    allowed: list[int] = []
    if device.startswith("cuda"):
        allowed = [torchrun_gpu] if torchrun_gpu is not None else list(range(torch.cuda.device_count()))
    unknown = [gpu for gpu in gpus if gpu not in allowed]
    if unknown:
        raise UserError(f"--max-memory names GPU {unknown[0]}, but torch sees {torch.cuda.device_count()} GPU(s)")
    budget: MaxMemory = {gpu: given.get(gpu) or torch.cuda.mem_get_info(gpu)[0] for gpu in allowed}
    budget["cpu"] = given.get("cpu") or psutil.virtual_memory().available
    return budget


def check_map_devices(device_map: str | dict[str, int | str], device: str, torchrun: bool) -> None:
    """A device map file may name GPUs only with ``--device cuda``, and is refused under torchrun, where the
    same file would put every rank's model on the same devices."""
    if isinstance(device_map, str):
        return
    if torchrun:
        raise UserError(
            "--device-map FILE.json under torchrun would place every rank's model on the same devices; "
            "give --device-map auto (each rank on its own GPU, the CPU and disk)"
        )
    gpus = [str(d) for d in device_map.values() if str(d) not in ("cpu", "disk")]
    if gpus and not device.startswith("cuda"):
        raise UserError(f"--device-map places modules on {gpus[0]}, but --device is {device}: give --device cuda")


def inside(path: Path, folder: Path) -> bool:
    path, folder = path.resolve(), folder.resolve()
    return path == folder or folder in path.parents


def offload_space(named: str | None, forbidden: dict[str, Path]) -> Path:
    """A fresh folder for accelerate's offloaded weights (``placed``: removed with the model): a new subfolder
    of ``named`` (made if missing; whatever it already holds is never touched, and ``named`` itself never
    removed) or of the system's temporary folder. ``forbidden``: the folders, by what they are (the
    checkpoint, the output folder, the coefficient cache), it may not lie inside."""
    parent = Path(named) if named is not None else Path(tempfile.gettempdir())
    for what, folder in forbidden.items():
        if named is not None and inside(parent, folder):
            raise UserError(f"--offload-folder {named} lies inside the {what} {folder}; give a folder elsewhere")
    if parent.exists() and not parent.is_dir():
        raise UserError(f"--offload-folder {named} is a file, not a folder")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=OFFLOAD_PREFIX, dir=parent))
    except OSError as exc:
        raise UserError(f"--offload-folder {parent}: cannot make a folder there ({first_line(exc)})") from None


def placed(place: Placement | None, load: Callable[[Placement | None], Loaded]) -> Loaded:
    """``load(place)``, with ``place``'s offload folder removed when loading fails, else once the model it
    returns is gone (or when the process exits): offloaded weights live exactly as long as their model."""
    if place is None:
        return load(None)
    try:
        model = load(place)
    except BaseException:
        shutil.rmtree(place.offload_folder, ignore_errors=True)
        raise
    weakref.finalize(model, shutil.rmtree, place.offload_folder, True)
    return model


def placement(
    device_map: str | None,
    max_memory: str | None,
    offload_folder: str | None,
    device: str,
    outside: dict[str, str | Path | None],
    ranks: Any = None,
) -> Placement | None:
    """The ``Placement`` that ``--device-map``, ``--max-memory`` and ``--offload-folder`` ask for on ``device``
    (None: none asked for, the model is held whole on ``device``); every bad value one line, checked before the
    offload folder is made (``offload_space``; not inside the folders ``outside`` names by what they are, None:
    no such folder). Under torchrun (``ranks``: ``audit.distributed.Ranks``) each rank places its own model on
    its own GPU (``--device cuda``: cuda:LOCAL_RANK), the CPU and disk."""
    torchrun = ranks is not None and ranks.world_size > 1
    torchrun_gpu = ranks.device.index if torchrun and ranks.device.type == "cuda" else None
    forbidden = {what: Path(folder) for what, folder in outside.items() if folder is not None}
    if device_map is None:
        if max_memory is not None or offload_folder is not None:
            given = "--max-memory" if max_memory is not None else "--offload-folder"
            raise UserError(f"{given} places a model across devices with --device-map; give --device-map auto too")
        return None
    mapped = parse_device_map(device_map)
    check_map_devices(mapped, device, torchrun)
    budget = device_budget(parse_max_memory(max_memory) if max_memory else {}, device, torchrun_gpu)
    return Placement(mapped, budget, offload_space(offload_folder, forbidden))


def is_placed(model: nn.Module) -> bool:
    """Whether big-model inference placed ``model`` (any module hooked by accelerate)."""
    return any(getattr(part, "_hf_hook", None) is not None for part in model.modules())


def value_devices(model: Any, device: torch.device | str) -> torch.device | list[torch.device]:
    """Where replayed values go: ``device``, or, for a model big-model inference placed, per controller its own
    execution device (the model's where the controller holds no weights)."""
    if not is_placed(model):
        return torch.device(device)
    main = execution_device(model)
    return [execution_device(controller, main) for controller in model.controllers]


HASH_THREADS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def each_fingerprint(fingerprint: Callable[[torch.Tensor], str], tensors: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """``fingerprint`` of each tensor by name, in threads (hashlib and torch's copies release the GIL for
    large buffers, so the weights of a model are hashed on every core)."""
    if len(tensors) < 2 or HASH_THREADS < 2:
        return {name: fingerprint(tensor) for name, tensor in tensors.items()}
    with ThreadPoolExecutor(max_workers=min(HASH_THREADS, len(tensors))) as pool:
        return dict(zip(tensors, pool.map(fingerprint, tensors.values())))


def tensor_fingerprints(model: nn.Module, fingerprint: Callable[[torch.Tensor], str]) -> dict[str, str]:
    """``fingerprint(tensor)`` of every state-dict entry of ``model`` by name (``each_fingerprint``), offloaded
    weights streamed in one module at a time (accelerate's ``align_module_device``), so a placed model
    fingerprints as the same model held in memory, never held whole."""
    from accelerate.utils import align_module_device

    if not is_placed(model):
        return each_fingerprint(fingerprint, model.state_dict())
    names = set(model.state_dict(keep_vars=True))
    found: dict[str, str] = {}
    for prefix, part in model.named_modules(remove_duplicate=False):
        own = [n for n in [*part._parameters, *part._buffers] if f"{prefix}.{n}".lstrip(".") in names]
        own = [n for n in own if f"{prefix}.{n}".lstrip(".") not in found]
        if not own:
            continue
        with align_module_device(part):  # onloaded to its execution device while read, offloaded again
            tensors = {**part._parameters, **part._buffers}  # as state_dict reads them (not a wrapper's attribute)
            found |= each_fingerprint(fingerprint, {f"{prefix}.{name}".lstrip("."): tensors[name] for name in own})
    return found


def check_device(name: str) -> None:
    """Refuse, in one line and before anything is loaded or written, a device the audit cannot compute on: not
    a torch device, CUDA without a GPU, or one that holds no values (``meta``); a tiny sum is tried there."""
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {name} was asked for, but torch sees no CUDA device")
    try:
        (torch.ones(2, device=name) * 2).sum().item()
    except (RuntimeError, NotImplementedError, AssertionError, ValueError) as exc:
        raise UserError(f"--device {name} cannot run a model: {first_line(exc)[:200]}") from None
