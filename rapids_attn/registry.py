"""The stage registry: every stage a job can run, in the order they run, and nothing else.

Each stage is a :class:`rapids_attn.stage.Stage` subclass in its own package (``rapids_attn/<name>/stage.py``); this
module lists them once, in run order (finetune, extract, learn, heads, relevance, compare, explain), and everything
that needs a list of stages reads it from here: the pipeline (:func:`default_stages`, :func:`parse_stages`, the
order it builds and runs them in), the CLI's ``--stages`` help (:func:`stages_help`), the local workers' fork server
(:func:`worker_stages`, :func:`worker_modules`: what the workers import) and the job's schema: each
registered stage's :attr:`~rapids_attn.stage.Stage.settings` is its job section, under
:meth:`~rapids_attn.stage.Stage.section_key` (``heads:``), so a stage with settings gets its section, its defaults,
its validation and its one-line errors (``job.yaml: heads.examples: ...``) without an edit to :mod:`rapids_attn.job`
(:func:`rapids_attn.job.job_model` builds the job's model from the core sections and these).

A new stage is one package and one registration:

- ``rapids_attn/<name>/config.py``: its settings, a :class:`rapids_attn.settings.Section` subclass (fields with
  defaults and pydantic constraints; validators raise ``ValueError`` with the fix, which the job loader turns into
  ``<file>: <section>.<field>: <message>``). It imports :mod:`rapids_attn.settings`, never :mod:`rapids_attn.job`;
- ``rapids_attn/<name>/stage.py``: the ``Stage`` subclass: ``name``, ``settings`` (its config class), ``requires`` /
  ``provides`` (store arrays, named in :mod:`rapids_attn.store.schema` with ``stage=<name>``), ``from_job``, ``run``
  returning a typed :class:`~rapids_attn.stage.StageResult` (it lands in ``summary.json`` under the stage's name),
  and where needed ``check``, ``runs_by_default`` (``<section>.enabled``), ``uses_cluster``, ``runs_on_workers`` /
  ``worker_modules``, ``report_section``, and the job hooks ``later_job`` / ``later_index`` / ``later_ready`` when it
  changes what the stages after it analyse (:mod:`rapids_attn.stage`);
- its line in :data:`_STAGES` below, at its place in the run order; or, for a stage outside the package (a plugin, a
  test), :func:`register` (``before=`` the stage it runs ahead of) and :func:`unregister`.

This module imports the stages' modules, which stay cheap to import (the registry is read before the workers
start: no torch at their top level). No stage imports this module, even inside a function: a stage that needs the
others (learn: do the workers stay up; explain: the report's sections) reads the run's
:attr:`rapids_attn.stage.RunContext.registry`, which the pipeline fills (tests/unit/test_import_cycles.py).
"""

from __future__ import annotations

import difflib
from contextlib import contextmanager
from types import MappingProxyType
from typing import TYPE_CHECKING

from rapids_attn import job
from rapids_attn.compare.stage import CompareStage
from rapids_attn.errors import JobConfigError
from rapids_attn.explain.stage import ExplainStage
from rapids_attn.extract.stage import ExtractStage
from rapids_attn.finetune.stage import FinetuneStage
from rapids_attn.heads.stage import HeadsStage
from rapids_attn.learn.stage import LearnStage
from rapids_attn.relevance.stage import RelevanceStage
from rapids_attn.stage import Stage

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

    from rapids_attn.job import JobConfig

#: every stage a job can run, by name, in the order they run: the one registry of stages
_STAGES: dict[str, type[Stage]] = {
    s.name: s for s in (FinetuneStage, ExtractStage, LearnStage, HeadsStage, RelevanceStage, CompareStage, ExplainStage)
}


def _sync_sections() -> None:
    """The job's schema follows the registry: one section per registered stage with settings."""
    job.use_stage_sections({st.section_key(): st.settings for st in _STAGES.values() if st.settings is not None})


_sync_sections()


def job_model() -> type[job.JobCore]:
    """The job's model with the registered stages' sections (:func:`rapids_attn.job.job_model`): what a job file is
    validated against (:func:`rapids_attn.jobfile.load_job`; ``job_model().model_validate(raw)`` for a job made in
    code)."""
    return job.job_model()


def registered_stages() -> Mapping[str, type[Stage]]:
    """Every stage a job can run, by name, in the order they run (a read-only view: :func:`register` changes it)."""
    return MappingProxyType(_STAGES)


def worker_stages() -> frozenset[str]:
    """The registered stages that run on the workers (:attr:`Stage.runs_on_workers`)."""
    return frozenset(name for name, st in _STAGES.items() if st.runs_on_workers)


def worker_modules() -> tuple[str, ...]:
    """What the local workers' fork server imports before their first task: ``distributed`` and the
    :attr:`~rapids_attn.stage.Stage.worker_modules` of the registered stages that run on the workers
    (:func:`rapids_attn.processes.worker_modules`)."""
    from rapids_attn import processes

    return processes.worker_modules(_STAGES.values())


def stages_help() -> str:
    """The ``--stages`` help of the CLI, from the registry: the names in run order, and which run by default."""
    optional = [
        name for name, st in _STAGES.items() if st.runs_by_default.__func__ is not Stage.runs_by_default.__func__
    ]
    text = f"comma-separated subset of {','.join(_STAGES)}, run in that order"
    if optional:
        sections = [f"{_STAGES[n].section_key()}.enabled" for n in optional]
        text += (
            f" (default: all but {_and(optional)}, each of which runs when the job sets {_and(sections, 'or')}: true)"
        )
    return text


def _and(words: list[str], last: str = "and") -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} {last} {words[-1]}"


def default_stages(cfg: JobConfig | None = None) -> tuple[str, ...]:
    """The stages a run without --stages runs: every stage the job does not leave off (``heads.enabled``)."""
    return tuple(name for name, st in _STAGES.items() if cfg is None or st.runs_by_default(cfg))


def parse_stages(text: str | None, cfg: JobConfig | None = None) -> tuple[str, ...]:
    """``--stages``: None (not given) is :func:`default_stages`; a given value must name at least one, and the
    stages run in the registry's order whatever the order written."""
    if text is None:
        return default_stages(cfg)
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise JobConfigError(
            f"--stages: no stage named in {text!r}; give one or more of {', '.join(_STAGES)}, comma-separated "
            "(or leave --stages out to run them all)"
        )
    for s in names:
        if s not in _STAGES:
            near = difflib.get_close_matches(s, list(_STAGES), n=1)
            hint = f"did you mean '{near[0]}'?" if near else f"stages are {', '.join(_STAGES)}"
            raise JobConfigError(f"--stages: unknown stage '{s}'; {hint}")
    return tuple(s for s in _STAGES if s in names)


def register(stage_cls: type[Stage], *, before: str | None = None) -> None:
    """Add a stage to the registry, last or just ahead of the stage named ``before`` (its place in the run order);
    its settings become a section of jobs validated from now on (:func:`rapids_attn.job.job_model`)."""
    name = getattr(stage_cls, "name", None)
    if not (isinstance(stage_cls, type) and issubclass(stage_cls, Stage)) or not name:
        raise TypeError(f"{stage_cls!r} is not a Stage subclass with a name")
    if name in _STAGES:
        raise ValueError(f"a stage named {name!r} is registered already ({_STAGES[name].__qualname__})")
    if before is not None and before not in _STAGES:
        raise ValueError(f"register(before={before!r}): no such stage; stages are {', '.join(_STAGES)}")
    key = stage_cls.section_key()
    if stage_cls.settings is not None and any(
        st.settings is not None and st.section_key() == key for st in _STAGES.values()
    ):
        raise ValueError(f"the job section {key!r} belongs to another registered stage; set {name}'s section")
    items = list(_STAGES.items())
    at = len(items) if before is None else [n for n, _ in items].index(before)
    items.insert(at, (name, stage_cls))
    _STAGES.clear()
    _STAGES.update(items)
    try:
        _sync_sections()
    except ValueError:
        del _STAGES[name]
        _sync_sections()
        raise


def unregister(name: str) -> None:
    """Take a stage out of the registry (the undo of :func:`register`); its section leaves the job's schema."""
    if name not in _STAGES:
        raise ValueError(f"no stage named {name!r} is registered")
    del _STAGES[name]
    _sync_sections()


@contextmanager
def registered(*stage_classes: type[Stage], before: str | None = None) -> Iterator[None]:
    """Inside, ``stage_classes`` are registered (in that order, each ahead of ``before`` or last); unregistered on
    the way out, whatever happens inside (a test's stage, a plugin tried once)."""
    done: list[str] = []
    try:
        for st in stage_classes:
            register(st, before=before)
            done.append(st.name)
        yield
    finally:
        for name in reversed(done):
            unregister(name)
