"""A package's public names imported when first used (PEP 562): importing the package imports none of the
modules behind them (torch, transformers, pandas), so ``import fca_workbench`` and ``fca --help`` stay fast.

A package assigns ``__getattr__, __dir__ = lazy_exports(__name__, {...})`` outside ``if TYPE_CHECKING:`` and
imports the same names inside it, so type checkers see them as plain imports.
"""

import importlib
import sys
from collections.abc import Callable, Iterable


def lazy_exports(
    package: str, exports: dict[str, Iterable[str]]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: each name of ``exports`` (module -> names) is taken from
    its module when first asked for, then kept in the package like an ordinary import."""
    home = {name: module for module, names in exports.items() for name in names}
    namespace = vars(sys.modules[package])

    def __getattr__(name: str) -> object:
        if name not in home:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home[name]), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *home})

    return __getattr__, __dir__
