"""The prefix cache under its short import path: a replay that starts at layer l from the state kept before it
(``audit.prefix``)."""

from fca_workbench.audit.prefix import PrefixCache, PrefixStore

__all__ = ["PrefixCache", "PrefixStore"]
