"""``fca lm-eval``: lm-eval's own command line, with the workbench's model registered as ``fca``.

``--model fca --model_args checkpoint=FOLDER,condition=NAME`` answers every request under one condition (the
live model for ``correct``, else a static profile estimated from the calibration set as ``fca eval`` estimates it,
or with ``audit=DIR`` the profile a finished audit of this checkpoint saved); every other flag is lm-eval's, and
so are the results files and ``--log_samples``. Beside each results file lm-eval writes, the binding (the model's
fingerprint, the condition, the audit it came from) is written, so the figures stay tied to the weights.
"""

import argparse
import importlib.metadata
import sys
import tempfile
from pathlib import Path

import torch
from lm_eval.__main__ import cli_evaluate
from lm_eval.api.registry import register_model

from fca_workbench.audit.inputs import CALIBRATION
from fca_workbench.audit.session import ReplaySession
from fca_workbench.audit.settings import AuditSettings
from fca_workbench.data.tasks import TASKS_DIR
from fca_workbench.downstream.eval_settings import check_eval_condition
from fca_workbench.downstream.frozen import ConditionLogits, eval_conditions
from fca_workbench.downstream.lm import WorkbenchLM
from fca_workbench.export.sources import audit_profiles
from fca_workbench.foundation.checkpoint import resolve_checkpoint
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.files import write_json
from fca_workbench.results.conditions import REFERENCE
from fca_workbench.results.layout import audit_cache_root
from fca_workbench.results.schema import read_audit_json

BINDING_PREFIX = "fca_binding"  # results_<date>.json gets fca_binding_<date>.json beside it
OPENED: list[dict] = []  # the binding of each model lm-eval opened in this process, for the command to write


@register_model("fca")
class FcaLM(WorkbenchLM):
    """lm-eval's ``--model fca``: a workbench checkpoint answering under one condition; its ``--model_args`` are
    those of ``fca eval`` that shape the model and its profile, plus ``condition`` and ``audit``."""

    def __init__(
        self,
        checkpoint: str,
        condition: str = REFERENCE,
        audit: str | None = None,
        calib: str | None = None,
        max_windows: int | None = None,
        window: int | None = None,
        dtype: str | None = None,
        seed: int = 0,
        trust_remote_code: bool = False,
        batch_size: int | str | None = None,
        max_batch_size: int | None = None,
        device: str | None = None,
    ) -> None:
        check_eval_condition(str(condition), "--model_args condition", "fca lm-eval")
        audited = read_audit_json(audit) if audit is not None else None
        fixed = audited[0]["settings"] if audited else {}  # the audit's dtype and window: its profiles' own
        self._cache = tempfile.TemporaryDirectory(prefix="fca-lm-eval-")  # the calibration capture, while it runs
        settings = AuditSettings(
            str(checkpoint),
            calibration=calib,
            max_windows=max_windows,
            window=window or fixed.get("window"),
            dtype=dtype or fixed.get("dtype", "float32"),
            seed=seed,
            device=lm_eval_device(device),
            batch_size=int(str(batch_size)) if str(batch_size).isdigit() else None,  # "auto": the audit's own fit
            trust_remote_code=trust_remote_code is True or str(trust_remote_code).lower() == "true",
            cache=self._cache.name,
        )
        resolved = resolve_checkpoint(settings.checkpoint, settings.trust_remote_code)
        session = ReplaySession.open(
            settings,
            checkpoint=resolved,
            read_now=(CALIBRATION,),
            memo_root=audit_cache_root(*audited) if audited else None,
        )
        eval_conditions([condition], session)  # one this model cannot replay: one line, before any task
        if audited and condition != REFERENCE:
            session.use_profiles(audit_profiles(session, *audited, "name this checkpoint's audit, or leave audit out"))
        logits = ConditionLogits(session, condition)
        super().__init__(session.model, session.tokenizer, session.windows(CALIBRATION).shape[1], session.batch_size)
        self.use(logits)
        OPENED.append(
            {
                "model": {**resolved.record(), "arch": session.model.arch, "fingerprint": session.fingerprint},
                "condition": condition,
                "audit": str(audited[1].resolve()) if audited else None,
                "calibration": audited[0]["data"]["calibration"] if audited else session.data_summary(CALIBRATION),
                "settings": {"dtype": settings.dtype, "device": settings.device, "seed": seed},
                "lm_eval": importlib.metadata.version("lm-eval"),
            }
        )


def lm_eval_device(device: str | None) -> str:
    """lm-eval's ``--device`` (its default ``cuda:0`` too), or the CPU where torch sees no CUDA device, with a note,
    as lm-eval's own ``hf`` model does."""
    if device is None or (device.startswith("cuda") and not torch.cuda.is_available()):
        if device is not None:
            print(f"fca: note: --device {device}, but torch sees no CUDA device: running on the CPU", file=sys.stderr)
        return "cpu"
    return device


def run_lm_eval(argv: list[str]) -> list[Path]:
    """lm-eval's ``run`` with ``argv`` (the shipped tasks' folder as ``--include_path`` unless one is given),
    then each opened ``fca`` model's binding written beside the results files it wrote; returns those files."""
    if not any(arg.split("=")[0] == "--include_path" for arg in argv):
        argv = [*argv, "--include_path", str(TASKS_DIR)]
    folder = results_folder(argv)
    before = set(folder.rglob("*.json")) if folder else set()
    OPENED.clear()
    saved, sys.argv = sys.argv, ["lm-eval", "run", *argv]
    try:
        cli_evaluate()
    finally:
        sys.argv = saved
    if not OPENED:
        return []
    if len(OPENED) > 1:
        raise UserError("fca lm-eval binds one fca model per run; lm-eval opened more than one")
    written = []
    for results in sorted(set(folder.rglob("*.json")) - before) if folder else []:
        written.append(binding_path(results))
        write_json(written[-1], {**OPENED[0], "results": results.name})
    if not written:
        print(f"fca: note: no --output_path, so the binding is not written: {OPENED[0]}", file=sys.stderr)
    return written


def results_folder(argv: list[str]) -> Path | None:
    """Where lm-eval writes its results files: ``--output_path`` / ``-o`` (its folder when it names a .json)."""
    given = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    given.add_argument("--output_path", "-o", default=None)
    value = given.parse_known_args(argv)[0].output_path
    if not value:
        return None
    path = Path(value)
    return path.parent if path.suffix == ".json" else path


def binding_path(results: Path) -> Path:
    """``results_<date>.json`` → ``fca_binding_<date>.json``; any other name gets ``.fca_binding.json``."""
    stem = results.stem
    if stem.startswith("results"):
        return results.with_name(BINDING_PREFIX + stem[len("results") :] + ".json")
    return results.with_name(f"{stem}.{BINDING_PREFIX}.json")
