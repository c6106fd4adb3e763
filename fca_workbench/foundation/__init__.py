"""The foundation every layer stands on: one error type, files written and read safely, fingerprints,
the command lines' number types, lazily imported names, where shipped files are, the checkpoint folder.

Nothing here imports torch.
"""
