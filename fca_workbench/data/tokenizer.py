"""The byte-level BPE tokenizer, trained with ``tokenizers`` on the train split only."""

from pathlib import Path
from typing import cast

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from fca_workbench.foundation.checkpoint import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.files import check_links_inside, reading
from fca_workbench.foundation.resources import shipped

TOKENIZER_DIR = shipped("data") / "tokenizer"  # the checkout's data/tokenizer, or the copy bundled in the wheel
EOS = "<|endoftext|>"


def train_tokenizer(texts: list[str], vocab_size: int = 4096) -> PreTrainedTokenizerFast:
    """A byte-level BPE on ``texts`` (every byte in its alphabet, so no text is ever unknown); EOS is its one
    special token."""
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token=EOS, bos_token=EOS, unk_token=EOS)


def load_tokenizer(folder: str | Path = TOKENIZER_DIR) -> PreTrainedTokenizerBase:
    """The tokenizer saved in a checkpoint (or data) folder; never fetched from a hub, never read through a
    link leading out of the folder."""
    folder = Path(folder)
    if not any((folder / name).is_file() for name in (TOKENIZER_FILE, TOKENIZER_CONFIG_FILE)):
        raise UserError(f"no tokenizer files in {folder}")
    check_links_inside(folder)
    with reading(f"unreadable tokenizer in {folder}"):  # tokenizers and transformers: their own types
        return AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)


def decode_tokens(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> list[str]:
    """Each token as the text it stands for (`` P``, not byte-level BPE's ``ĠP``), as a reader wants it shown."""
    return [cast(str, tokenizer.decode([i])) for i in ids]
