"""Every audit setting and its default is declared once (``audit/settings.py``): the command line's flags, ``fca
eval``, ``fca audit-many``, the notebooks' ``NotebookRun`` and ``fca reproduce``'s parameters derive theirs from it;
nothing here is restated by hand."""

import dataclasses

from fca_workbench.audit.settings import PAPER_RUN, AuditSettings, default, paper_default
from fca_workbench.cli import build_parser
from fca_workbench.cli.flag_settings import audit_settings, audits_settings, eval_settings
from fca_workbench.notebooks.notebook_run import AUDIT_NAMES, NotebookRun
from fca_workbench.notebooks.reproduce import DEFAULT_PARAMETERS

DECLARED = AuditSettings(checkpoint="ckpt")


def parsed(*argv: str):
    return build_parser().parse_args(list(argv))


def test_the_commands_flags_default_to_the_declaration():
    assert audit_settings(parsed("audit", "ckpt"), "ckpt") == DECLARED
    assert audits_settings(parsed("audit-many", "ckpt", "other")) == [
        DECLARED,
        dataclasses.replace(DECLARED, checkpoint="other"),
    ]
    assert eval_settings(parsed("eval", "ckpt", "--tasks", "fca_next_line")).audit == DECLARED


def test_the_paper_run_departs_from_the_declaration_only_where_it_says():
    notebook_fields = {f.name: f.default for f in dataclasses.fields(NotebookRun)}
    for name, value in notebook_fields.items():
        setting = AUDIT_NAMES.get(name, name)
        if setting in {f.name for f in dataclasses.fields(AuditSettings)}:
            assert value == paper_default(setting), name
            assert (value == default(setting)) == (setting not in PAPER_RUN), name
    assert {name: DEFAULT_PARAMETERS[name] for name in DEFAULT_PARAMETERS if name != "checkpoints"} == {
        name: paper_default(AUDIT_NAMES.get(name, name)) for name in DEFAULT_PARAMETERS if name != "checkpoints"
    }
    assert set(PAPER_RUN) < set(DEFAULT_PARAMETERS)
