"""``python -m fca_workbench.adapters.family_table``: print the docs' table of every classified family
(docs/guides/families.md holds it; ``tests/test_zoo_families.py`` keeps the two equal)."""

import argparse

from fca_workbench.adapters.classification import family_table


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args(argv)
    print(family_table(), end="")


if __name__ == "__main__":
    main()
