"""lm-eval's ``custom_dataset`` for the shipped tasks: their JSONL read from beside this file, so
``lm_eval --include_path <checkout>/data/tasks`` (and ``fca eval``) run them from any working directory.

lm-eval loads this module by path for the ``!function local_files.load`` of a task's YAML and calls ``load`` with
the task's ``metadata`` and ``dataset_kwargs``; ``datasets`` alone would resolve ``data_files`` against the
current folder.
"""

from pathlib import Path

import datasets

HERE = Path(__file__).resolve().parent


def load(data_files: dict[str, str], **metadata: object) -> datasets.DatasetDict:
    """Each split's JSONL (``data_files``: split → a file name in this folder), read offline with ``datasets``'
    own JSON loader; a name leading out of this folder is refused."""
    paths = {split: HERE / name for split, name in data_files.items()}
    outside = [name for name, path in zip(data_files.values(), paths.values()) if path.resolve().parent != HERE]
    if outside:
        raise ValueError(f"a shipped task's data_files must lie in {HERE}: {outside}")
    return datasets.load_dataset("json", data_files={split: str(path) for split, path in paths.items()})
