"""``jsonschema``, imported without its optional IRI format checker.

When ``rfc3987_syntax`` is installed (Jupyter brings it through ``jsonschema[format-nongpl]``), importing
jsonschema builds ~40 Earley parsers for the ``iri`` formats: about 2 s on an idle core and 7-20 s on the
loaded 2-core reference machine, paid by every process that opens a coefficient cache or an audit
(python-jsonschema/jsonschema#1428). No workbench schema uses those formats, so that one optional import
is refused while jsonschema loads (it skips a checker whose library raises ImportError) and allowed again
afterwards.
"""

import importlib
import sys

SKIPPED = "rfc3987_syntax"


def import_jsonschema():
    """The ``jsonschema`` module (already imported, or imported now without ``rfc3987_syntax``)."""
    if "jsonschema" in sys.modules:
        return sys.modules["jsonschema"]
    refuse = SKIPPED not in sys.modules
    if refuse:
        sys.modules[SKIPPED] = None  # an import of a None entry raises ImportError
    try:
        return importlib.import_module("jsonschema")
    finally:
        if refuse:
            del sys.modules[SKIPPED]
