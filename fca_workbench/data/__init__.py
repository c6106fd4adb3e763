"""Text in, windows out: the shipped corpus splits, the tokenizer, and fixed-length windows.

Windows are the unit of batching, reassignment and bootstrap throughout the workbench, so everything
downstream sees a ``LongTensor [N, window]``.
"""

from fca_workbench.data.corpus import CORPUS_DIR, DATA_DIR, SPLITS, prepare_corpus, split_path
from fca_workbench.data.tokenizer import EOS, TOKENIZER_DIR, load_tokenizer, train_tokenizer
from fca_workbench.data.windows import even_sample, load_windows, make_windows, read_documents, token_stream

__all__ = [
    "CORPUS_DIR",
    "DATA_DIR",
    "EOS",
    "SPLITS",
    "TOKENIZER_DIR",
    "even_sample",
    "load_tokenizer",
    "load_windows",
    "make_windows",
    "prepare_corpus",
    "read_documents",
    "split_path",
    "token_stream",
    "train_tokenizer",
]
