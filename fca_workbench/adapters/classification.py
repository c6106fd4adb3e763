"""Every causal-LM family of transformers' ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``, classified, as data: the
controller kinds the adapter finds in it (``controller_kinds`` of its ``audit.json``), or ``static`` with
the reason it has none, and what it leaves out (``left_out``).

``tests/test_zoo_families.py`` enumerates the live mapping at collection time: a family transformers adds
fails until it is classified here, and every family the zoo can build tiny is built and its discovered kinds
asserted equal to these. ``python -m fca_workbench.adapters.classification --table`` prints the docs'
table (docs/guides/families.md; a test keeps the two equal). At run time a ``model_type`` absent here gets
one line saying so and what discovery found (``classification_note``); the audit continues.
"""

import argparse
from dataclasses import dataclass

from fca_workbench.adapters.families import (
    MOE_FAMILIES,
)

SHARED_EXPERT_GATE = "shared_expert_gate"  # ``fca_workbench.adapters.kinds.SHARED_EXPERT_GATE``'s name


@dataclass(frozen=True)
class Classified:
    """``kinds``: the controller kinds found (routers as ``router:OUTPUT``). ``static``: why a family with no
    kind has none. ``left_out``: what discovery finds and does not replay (``audit.json``'s ``left_out``).
    ``untested``: why the zoo cannot build it tiny (its kinds then come from the family it wraps)."""

    kinds: tuple[str, ...] = ()
    static: str = ""
    left_out: str = ""
    untested: str = ""


DENSE = Classified(
    static="attention and MLPs only: no module emits coefficients for another computation (a gated MLP's "
    "act(gate_proj(x)) * up_proj(x) is the layer's own nonlinearity)"
)
LOOPED = "an attention output gate in a layer that runs several times per forward (reported, runs live)"


def router(model_type: str) -> str:
    """The kind name of the family's MoE routers (``fca_workbench.adapters.routers.router_kind``)."""
    return f"router:{MOE_FAMILIES[model_type].output if model_type in MOE_FAMILIES else 'top_k'}"


def gated(*kinds: str, **notes: str) -> Classified:
    return Classified(kinds=tuple(sorted(kinds)), **notes)


def moe(model_type: str, *kinds: str, **notes: str) -> tuple[str, Classified]:
    return model_type, gated(router(model_type), *kinds, **notes)


# fmt: off
FAMILIES: dict[str, Classified] = dict([
])
# fmt: on


def classification_note(model_type: str, kinds: list[str], left_out: list[str]) -> str | None:
    """One line for a ``model_type`` the classification does not know (what discovery found), else None."""
    if model_type in FAMILIES:
        return None
    found = ", ".join(sorted(set(kinds))) or "no controller"
    out = f"; {len(left_out)} left out" if left_out else ""
    return (
        f"model_type '{model_type}' is not in fca_workbench's family classification "
        f"(fca_workbench/adapters/classification.py); discovery found: {found}{out}"
    )


def family_table() -> str:
    """The docs' Markdown table of every classified family (between ``<!-- classification -->`` markers
    in docs/guides/families.md)."""
    rows = ["| model_type | controller kinds | notes |", "|---|---|---|"]
    for model_type, entry in sorted(FAMILIES.items()):
        kinds = ", ".join(f"`{kind}`" for kind in entry.kinds) or "static"
        notes = [entry.static, f"left out: {entry.left_out}" if entry.left_out else ""]
        notes.append(f"not built tiny: {entry.untested}" if entry.untested else "")
        rows.append(f"| `{model_type}` | {kinds} | {'; '.join(note for note in notes if note)} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", action="store_true", help="print the docs' family table (Markdown)")
    if parser.parse_args(argv).table:
        print(family_table(), end="")


if __name__ == "__main__":
    main()
