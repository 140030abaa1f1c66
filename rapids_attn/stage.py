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
  ``summary.json``.

To add a stage: write ``rapids_attn/<name>/stage.py`` with a ``Stage`` subclass, add its arrays to
the schema with ``stage=<name>``, and list it in :data:`rapids_attn.pipeline.STAGES`. Nothing else
has to change (docs/architecture.md, "Adding a stage").
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from rapids_attn.data import DataIndex
    from rapids_attn.devices import DevicePlan
    from rapids_attn.extract.model import ModelInfo
    from rapids_attn.job import JobConfig
    from rapids_attn.store.schema import ArraySpec
    from rapids_attn.store.zarr_store import StoreLayout


@dataclass
class StageResult:
    """What a stage's run reports. Subclasses add typed fields; ``seconds`` is the stage's wall time."""

    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: the stages that run on a local cluster's workers (the pipeline starts the workers' fork server for them)
WORKER_STAGES = frozenset({"extract", "relevance", "heads"})


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
    #: what the Dask cluster looked like (workers, dashboard); filled by the pipeline when it starts one
    runtime: dict = field(default_factory=dict)
    #: results of the stages already run in this run, by name
    results: dict[str, StageResult] = field(default_factory=dict)
    #: seconds per step of this run (preflight and each stage), filled by the pipeline
    timings: dict[str, float] = field(default_factory=dict)
    #: set by the pipeline while a stage runs: the next stage's :meth:`Stage.warm`, bound to this run. A stage
    #: whose last tasks leave workers idle calls it once (:meth:`warm_next`), so those cores are not left idle
    warm_next_stage: Callable[[], None] | None = None

    def warm_next(self) -> None:
        """Start the next stage's imports now, once (a no-op when there is no next stage, or after the first)."""
        warm, self.warm_next_stage = self.warm_next_stage, None
        if warm is not None:
            warm()

    @property
    def store_path(self) -> Path:
        return self.run_dir / "store.zarr"


class Stage(ABC):
    """One stage of a job; see the module docstring for the contract."""

    name: ClassVar[str]
    requires: ClassVar[tuple[ArraySpec, ...]] = ()
    provides: ClassVar[tuple[ArraySpec, ...]] = ()

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

    def warm(self, ctx: RunContext, client=None) -> None:
        """While the stage before this one runs its last tasks on fewer workers than there are: start what
        this stage would otherwise wait for first (imports here and, given ``client`` (when :meth:`uses_cluster`),
        on the workers), without blocking. The default does nothing."""

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
    what :func:`rapids_attn.heads.stage.sample_positions` will pick, counted in preflight."""
    probes = sum(1 for ex in ctx.data.inline if str(ex.group or "").startswith("probe:"))
    n = len(ctx.data) - probes
    return n if k is None else min(k, n)
