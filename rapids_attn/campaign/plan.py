"""A campaign: one job body run over many models and datasets, each (model, dataset) an ordinary run directory
(issue 50; docs/campaigns.md).

The campaign file names the job (a job file, its path relative to the campaign file), overrides for every run
(``set``), the models (a hub id or folder each, with a family, a variant and overrides of their own) and the
datasets (a label and their ``data.*`` overrides; none: the job's data). Run ``i`` is model ``i // D`` on dataset
``i % D`` (D datasets), in ``output.dir/runs/<model label>/<dataset label>``: the order a batch scheduler's array
index follows. Every run's job is validated before any runs, so a typo fails the campaign in one line, exit 2.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator

from rapids_attn.errors import JobConfigError
from rapids_attn.settings import Section

LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")


def _label_from(name: str) -> str:
    """A model name as a folder name: its last path part, other characters as '-'."""
    base = str(name).rstrip("/\\").replace("\\", "/").split("/")[-1] or "model"
    return re.sub(r"[^A-Za-z0-9._-]", "-", base)[:80].lstrip("-._") or "model"


class CampaignModel(Section):
    #: a hub id or a model folder (relative to the campaign file), as model.name takes it.
    name: str = Field(min_length=1)
    #: the run's folder name (default: the name's last part).
    label: str | None = None
    #: e.g. llama, qwen2, bert: the merge's per-family summaries group by it.
    family: str = ""
    #: e.g. base, instruct, fine-tuned.
    variant: str = ""
    #: overrides of this model's runs, as --set takes them (``model.max_length: 256``).
    set: dict[str, Any] = Field(default_factory=dict)

    @field_validator("label")
    @classmethod
    def _label(cls, v):
        if v is not None and not LABEL.match(v):
            raise ValueError("a folder name: letters, digits, '.', '_' or '-', at most 80")
        return v


class CampaignDataset(Section):
    #: the run's folder name under its model's.
    label: str = "data"
    #: its ``data.*`` overrides (``path: squad.json`` or ``data.path: ...``; a relative path is the campaign
    #: file's); none: the job's data.
    set: dict[str, Any] = Field(default_factory=dict)

    @field_validator("label")
    @classmethod
    def _label(cls, v):
        if not LABEL.match(v):
            raise ValueError("a folder name: letters, digits, '.', '_' or '-', at most 80")
        return v


class CampaignOutput(Section):
    #: where the runs (runs/<model>/<dataset>), the task records and the logs go (relative to the campaign file).
    dir: str = Field(min_length=1)


class CampaignFile(Section):
    name: str = Field(min_length=1)
    #: the job file every run starts from (relative to the campaign file).
    job: str = Field(min_length=1)
    #: overrides for every run, as --set takes them.
    set: dict[str, Any] = Field(default_factory=dict)
    models: list[CampaignModel] = Field(min_length=1)
    datasets: list[CampaignDataset] = Field(default_factory=lambda: [CampaignDataset()], min_length=1)
    output: CampaignOutput


@dataclass(frozen=True)
class Run:
    """One (model, dataset) of a campaign: its index, label, folder and the ``--set`` overrides of its job."""

    index: int
    label: str
    model: CampaignModel
    dataset: CampaignDataset
    run_dir: Path
    overrides: tuple[str, ...]
    #: the run's settings as the campaign file writes them (paths relative to it, no output folder): what
    #: :attr:`spec_hash` hashes, so that the campaign's folder moved, or mounted elsewhere on another node, leaves
    #: its finished runs done
    written: tuple[str, ...] = ()

    @property
    def spec_hash(self) -> str:
        """What the run is asked to be: a finished run whose record holds another hash is stale."""
        return hashlib.sha256("\n".join(self.written or self.overrides).encode()).hexdigest()[:16]


@dataclass
class Campaign:
    path: Path
    spec: CampaignFile
    job: Path
    out: Path
    runs: list[Run]

    @property
    def tasks_dir(self) -> Path:
        return self.out / "tasks"

    @property
    def logs_dir(self) -> Path:
        return self.out / "logs"


def _value(v: Any) -> str:
    """An override's value as --set reads it (YAML; JSON is YAML's flow form)."""
    return v if isinstance(v, str) else json.dumps(v)


def _resolve(base: Path, name: str) -> str:
    """A relative path that exists beside the campaign file, as an absolute path; anything else as written."""
    p = Path(name).expanduser()
    if not p.is_absolute() and (base / p).exists():
        return str((base / p).resolve())
    return name


def load_campaign(path: str | Path, validate_jobs: bool = True) -> Campaign:
    """Read and check a campaign file: its schema, unique labels, and (``validate_jobs``) every run's job."""
    from rapids_attn.jobfile import format_validation_error, load_job, yaml_load

    path = Path(path)
    if not path.is_file():
        raise JobConfigError(f"{path}: no such campaign file")
    try:
        raw = yaml_load(path.read_text(encoding="utf-8"))
    except Exception as e:  # noqa: BLE001 - a YAML error: one line naming the file
        raise JobConfigError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise JobConfigError(f"{path}: a campaign file is a mapping (name, job, models, ...)")
    try:
        spec = CampaignFile(**raw)
    except ValidationError as e:
        raise JobConfigError(format_validation_error(e, str(path))) from None
    base = path.resolve().parent
    job = Path(_resolve(base, spec.job))
    if not job.is_file():
        raise JobConfigError(f"{path}: job: no such job file: {spec.job} (relative to the campaign file)")
    out = Path(spec.output.dir).expanduser()
    out = Path(os.path.normpath(out if out.is_absolute() else base / out))
    runs = []
    seen: dict[str, int] = {}
    for m_i, m in enumerate(spec.models):
        m_label = m.label or _label_from(m.name)
        for d_i, d in enumerate(spec.datasets):
            label = f"{m_label}/{d.label}"
            if label in seen:
                raise JobConfigError(
                    f"{path}: models[{m_i}]: run {label} is named twice (models {seen[label]} and {m_i}); give one "
                    "a label"
                )
            seen[label] = m_i
            run_dir = out / "runs" / m_label / d.label
            data = {k if k.startswith("data.") else f"data.{k}": v for k, v in d.set.items()}
            sets = {
                **spec.set,
                **{k: _resolve(base, v) if k == "data.path" and isinstance(v, str) else v for k, v in data.items()},
                **m.set,
                "model.name": _resolve(base, m.name),
                "output.dir": str(run_dir),
            }
            overrides = tuple(f"{k}={_value(v)}" for k, v in sets.items())
            written = {"job": spec.job, **spec.set, **data, **m.set, "model.name": m.name}
            runs.append(
                Run(len(runs), label, m, d, run_dir, overrides, tuple(f"{k}={_value(v)}" for k, v in written.items()))
            )
    campaign = Campaign(path.resolve(), spec, job, out, runs)
    if validate_jobs:
        for r in runs:
            try:
                load_job(job, list(r.overrides))
            except JobConfigError as e:
                raise JobConfigError(f"{path}: run {r.index} ({r.label}): {e}") from None
    return campaign
