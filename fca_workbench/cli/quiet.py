"""transformers' own progress bars and warnings off while a command runs: the workbench's tqdm bars say what is
happening, and theirs would interleave."""

from transformers.utils import logging as hf_logging


def quiet_transformers() -> None:
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
