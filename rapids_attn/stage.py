"""The stage contract: what every stage of a job (extract, learn, explain, and the ones to come) implements.

A stage is a small object built from its own job sections only (:meth:`Stage.from_job` picks them),
so it can be built and run without a job file. It declares:

- ``name``: what ``--stages`` calls it;
- ``requires`` / ``provides``: the store arrays it reads and writes, named only through
  :mod:`rapids_attn.store.schema`. The pipeline checks, before any worker starts, that every
  required array is provided by an earlier stage of the same run or by a stage whose completion
  flag is set in the store;
- :meth:`Stage.check`: the checks that can be made in preflight (inputs, settings, the store);
- :meth:`Stage.uses_cluster`: whether its run needs the Dask client (the pipeline owns the client's
  lifetime: it starts the cluster before the first stage that needs it and closes it after the last);
- :meth:`Stage.run`: does the work and returns a typed :class:`StageResult`, which goes into
  ``summary.json`` under the stage's name; the pipeline times it and prints one line on stderr as it starts and
  one when it ends (``rapids_attn: learn: done in 23.4 s``);
- where it runs and how it is reported, as class attributes the pipeline, the runtime and the explain stage read
  (none of them keeps a list of stages of its own):

  - ``runs_on_workers``: its work is tasks on the local cluster's workers, each with a model of its own, so a run
    that includes it starts the workers' fork server before its preflight (:func:`rapids_attn.registry.worker_stages`);
  - ``worker_modules``: what those workers import before their first task; the fork server imports them once
    (:func:`rapids_attn.processes.worker_modules`), so a worker forked from it has them in memory;
  - ``summarised``: the explain stage's summary already carries this stage's result, so ``summary.json`` does not
    repeat it under the stage's name;
  - :meth:`Stage.report_section`: how the explain stage reports it (a :class:`ReportSection`: what it adds to
    ``summary.json`` and the section, figures and link of ``report/index.html``), or None.

- its job section: ``settings``, a :class:`rapids_attn.settings.Section` subclass in the stage's package
  (``rapids_attn/<name>/config.py``), under the key :meth:`Stage.section_key` (its name unless ``section`` says
  otherwise); the job's schema has one such section per registered stage (:func:`rapids_attn.job.job_model`), so
  ``cfg.<key>`` is the stage's validated settings, with its defaults when the job leaves it out. A section whose
  settings change what the store holds (finetune, enabled) says which in its
  :meth:`~rapids_attn.settings.Section.store_settings`, and those enter the store's key;
- how it changes the job for the stages after it, where it does (the finetune stage: they analyse the fine-tuned
  model over the held-out examples), as three hooks the pipeline applies in the registry's order, to every stage
  after it whether or not this run runs it (:func:`rapids_attn.pipeline.stage_jobs`):

  - :meth:`Stage.later_job`: the job as the later stages see it (default: unchanged); the job it returns keeps the
    job as written (:attr:`rapids_attn.job.JobCore.as_written`) for a later stage that also needs that (compare);
  - :meth:`Stage.later_index`: the examples the later stages read, where it changes them (default: the job's);
  - :meth:`Stage.later_ready`: whether what :meth:`Stage.later_job` points at exists already (a model folder); until
    it does, preflight describes the job's own model, and a run that needs it without this stage is refused.

The stages a job can run are registered in one place, :mod:`rapids_attn.registry`, in the order they run. To add a
stage: write ``rapids_attn/<name>/config.py`` (its settings, if any) and ``rapids_attn/<name>/stage.py`` with a
``Stage`` subclass, its arrays in the schema with ``stage=<name>``, and its line in the registry (or
:func:`rapids_attn.registry.register`). Nothing else has to change. This module imports neither the registry nor the
pipeline.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from rapids_attn.data import DataIndex
    from rapids_attn.devices import DevicePlan
    from rapids_attn.extract.model import ModelInfo
    from rapids_attn.job import JobConfig
    from rapids_attn.settings import Section
    from rapids_attn.store.schema import ArraySpec
    from rapids_attn.store.zarr_store import StoreLayout


@dataclass
class StageResult:
    """What a stage's run reports. Subclasses add typed fields; ``seconds`` is the stage's wall time."""

    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class RunContext:
    """What preflight resolved for this run, handed to every stage's ``check`` and ``run``."""

    #: the run directory and the store inside it
    run_dir: Path
    #: the job as resolved (presets merged, defaults filled), recorded in the store and job.yaml
    job: dict
    #: name of the job (``name:``)
    job_name: str
    #: the dataset's index: its length is the number of examples, ``data.read([3, 17])`` reads two of them;
    #: it never holds the dataset (workers read their own rows)
    data: DataIndex
    model: ModelInfo
    layout: StoreLayout
    #: hash of the settings that decide the store's contents (JobConfig.extraction_key)
    key: str
    devices: DevicePlan
    #: the run's seed (runtime.seed)
    seed: int
    #: the stages this run runs, in order
    stages: tuple[str, ...]
    overwrite: bool = False
    #: every stage a job can run, by name, in run order, as the pipeline read it from :mod:`rapids_attn.registry`: a
    #: stage that needs the others (which run on the workers, which have report sections) reads them here, never
    #: from the registry, which imports the stages (tests/unit/test_import_cycles.py)
    registry: Mapping[str, type[Stage]] = field(default_factory=dict)
    #: what the Dask cluster looked like (workers, dashboard); filled by the pipeline when it starts one
    runtime: dict = field(default_factory=dict)
    #: results of the stages already run in this run, by name
    results: dict[str, StageResult] = field(default_factory=dict)
    #: seconds per step of this run (preflight and each stage), filled by the pipeline
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def store_path(self) -> Path:
        return self.run_dir / "store.zarr"


class Stage(ABC):
    """One stage of a job; see the module docstring for the contract."""

    name: ClassVar[str]
    requires: ClassVar[tuple[ArraySpec, ...]] = ()
    provides: ClassVar[tuple[ArraySpec, ...]] = ()
    #: its work is tasks on the local cluster's workers, each loading a model of its own: a run that includes it
    #: starts the workers' fork server before its preflight (:func:`rapids_attn.registry.worker_stages`). Not the
    #: same as :meth:`uses_cluster`, which says, per run, whether :meth:`run` needs the Dask client at all
    runs_on_workers: ClassVar[bool] = False
    #: the modules its workers import before their first task (its task functions' module, torch, ...): the fork
    #: server a local cluster's workers fork from imports them once (:func:`rapids_attn.processes.worker_modules`)
    worker_modules: ClassVar[tuple[str, ...]] = ()
    #: the explain stage's summary already carries this stage's result (read back from the store, or through its
    #: :meth:`report_section`), so ``summary.json`` does not repeat it under the stage's name
    summarised: ClassVar[bool] = False
    #: its job section's settings (``rapids_attn/<name>/config.py``), or None: it has no section of its own
    settings: ClassVar[type[Section] | None] = None
    #: the key of its section in the job (``heads:``); empty: the stage's name
    section: ClassVar[str] = ""

    @classmethod
    def section_key(cls) -> str:
        """Where its settings are in the job (``cfg.<key>``, ``<key>:`` in a job file)."""
        return cls.section or cls.name

    @classmethod
    def later_job(cls, cfg: JobConfig) -> JobConfig:
        """The job as the stages after this one see it (they are built from it): ``cfg`` itself unless this stage
        changes what they analyse (finetune, enabled: ``model.name`` becomes its fine-tuned folder). Applied whether
        or not this run runs the stage, so the later stages of a run that leaves it out read what it made."""
        return cfg

    @classmethod
    def later_index(cls, cfg: JobConfig) -> DataIndex | None:
        """The examples the stages after this one read (finetune, enabled: the held-out groups'), or None: the
        job's own (``data``). ``cfg`` is the job this stage is built from."""
        return None

    @classmethod
    def later_ready(cls, cfg: JobConfig) -> bool:
        """Whether what :meth:`later_job` points the later stages at is there already (the fine-tuned folder,
        complete). Until then preflight describes the job's own model (the same layers, heads and tokenizer), and a
        run that needs it and does not run this stage is refused."""
        return True

    @classmethod
    def report_section(cls) -> ReportSection | None:
        """How the explain stage reports this stage's results (a section of ``report/index.html`` and what it adds
        to ``summary.json``), or None: not reported beyond its result under its name. Imports what it needs when
        called, so that the stage's module stays cheap to import (the registry is read before the workers start)."""
        return None

    @classmethod
    @abstractmethod
    def from_job(cls, cfg: JobConfig) -> Stage:
        """Build the stage from the job sections it uses, and nothing else."""

    @classmethod
    def runs_by_default(cls, cfg: JobConfig) -> bool:
        """Whether a run without --stages runs this stage (the heads stage only when the job enables it)."""
        return True

    def check(self, ctx: RunContext) -> None:
        """Preflight: raise a UserError (one line naming the field or file) before any worker starts."""

    def uses_cluster(self, ctx: RunContext) -> bool:
        """True when :meth:`run` needs the Dask client."""
        return False

    @abstractmethod
    def run(self, ctx: RunContext, client=None) -> StageResult:
        """Do the stage's work; ``client`` is the Dask client when :meth:`uses_cluster` said so."""

    def release(self, client) -> None:
        """The cluster stays up for a later stage: free what this stage left on the workers."""

    def require_complete(self, group, path: Path) -> None:
        """At run time, before reading: every stage this one requires has its completion flag set in
        ``group`` (preflight checked the same; this guards a store changed in between)."""
        from rapids_attn.errors import StoreError
        from rapids_attn.store.zarr_store import complete_attr

        for writer in dict.fromkeys(spec.stage for spec in self.requires):
            if writer != self.name and not group.attrs.get(complete_attr(writer)):
                raise StoreError(
                    f"{path}: the {self.name} stage needs the {writer} stage's results, and they are not "
                    f"complete in the store; rerun with --stages {writer}"
                )


class ReportSection(ABC):
    """How the explain stage reports one stage (:meth:`Stage.report_section`).

    The explain stage calls, for every registered stage that has one, in the registry's order: :meth:`read` once
    its own findings are made (what the stage left in the store, added to ``summary.json``), then, when it writes
    the report, :meth:`figures` and :meth:`html`. The section is linked from the page's navigation, before the
    clusters, when its HTML is not empty."""

    #: the section's anchor in report/index.html and its title in the page's navigation
    anchor: ClassVar[str]
    title: ClassVar[str]
    #: the figure files it may write (a regular expression of their names without ``.png``): an earlier report's
    #: files of these names that this report did not write are removed
    figure_pattern: ClassVar[str] = ""

    @abstractmethod
    def read(self, g, summary: dict, findings, arrays, earlier: dict[str, Any]) -> Any:
        """Read the stage's results from the store group ``g`` into ``summary`` (``summary.json``'s body, in the
        order its keys are written); may add warnings to ``findings.warnings``. ``earlier``: what the sections read
        before this one returned, by stage name. Returns what :meth:`figures` and :meth:`html` take (None: the
        stage left nothing to report)."""

    def figures(self, out_dir: Path, state: Any) -> list[str]:
        """Render the section's figures into ``out_dir``; their file names."""
        return []

    @abstractmethod
    def html(self, state: Any, figures: list[str]) -> str:
        """The section (``<section id="{anchor}">...``), or "" when there is nothing to show."""


def check_max_length(field: str, value: int | None, ctx: RunContext) -> None:
    """A stage's own ``max_length`` (heads, relevance) fits the model's positions: refused in preflight, where a
    forward would otherwise fail on a worker ("size of tensor a (2710) must match ... (512)")."""
    from rapids_attn.errors import JobConfigError

    limit = ctx.model.positions
    if value is not None and limit is not None and value > limit:
        raise JobConfigError(
            f"{field}: {value} exceeds the model's {limit} positions; set it to {limit} or less (or leave it unset)"
        )


def evaluated_count(ctx: RunContext, k: int | None) -> int:
    """How many examples a stage that samples ``k`` of the job's examples (the probes left out) evaluates:
    what :func:`rapids_attn.stagekit.sample_positions` will pick, counted in preflight."""
    probes = sum(1 for ex in ctx.data.inline if str(ex.group or "").startswith("probe:"))
    n = len(ctx.data) - probes
    return n if k is None else min(k, n)
