"""What the stages share: the driver's preamble of a stage's ``run`` and the worker side's model cache.

The driver side (used by the heads, relevance and explain stages; the three worker stages map their tasks with
:func:`map_tasks`):

- :func:`open_for_run`: open the store for writing, check that every stage this one requires is complete in it
  (:meth:`rapids_attn.stage.Stage.require_complete`), and clear the stage's own completion flag before it
  rewrites its arrays;
- :func:`evaluated_positions` / :func:`sample_positions`: the seeded sample of examples a stage evaluates (the
  probes left out), and :func:`shards_of`: that sample cut into tasks, two per worker;
- :func:`map_tasks`: a task function mapped over tasks on the Dask workers, the results in the tasks' order,
  with a progress bar (:func:`progress`);
- :func:`json_safe`: a result made of NumPy values as ``summary.json`` and the store's attributes take it;
- :func:`stages_for` / :func:`run_stages`: a stage that runs other stages over another model (compare
  runs extract, and heads, on each compared model into ``models/<label>``): built from that model's job, checked
  in the stage's own preflight, run in a context of their own on the client the stage was given.

The worker side: :class:`WorkerCache`, one job's model (and what goes with it) per worker process, built by the
first task of the job and kept for the next ones. This module imports only the standard library and NumPy at
the top: the workers' modules import it.
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

if TYPE_CHECKING:
    from rapids_attn.stage import RunContext, Stage

T = TypeVar("T")

#: what the workers of a stage that runs a transformers model import before its first task (with the stage's own
#: task module): the stages list them in their :attr:`~rapids_attn.stage.Stage.worker_modules`
MODEL_WORKER_MODULES = (
    "torch",
    "transformers.modeling_utils",
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto",
)


# -- the worker side ---------------------------------------------------------------------------------------


class WorkerCache(Generic[T]):
    """One job's object per worker process, by the job's key: built by the first task that asks (under a lock:
    a worker's threads run tasks at once) and kept for the job's later tasks. A task of another job replaces it
    (the old one is dropped before the new one is built: one job's model in memory at a time);
    :meth:`release` drops it (the stage's ``release``, when a later stage keeps the workers)."""

    def __init__(self) -> None:
        self._items: dict[str, T] = {}
        self._lock = threading.Lock()

    def get(self, key: str, build: Callable[[], T]) -> T:
        """The object of job ``key``, built by ``build()`` when this worker has none for it."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                self._items.clear()
                item = self._items[key] = build()
            return item

    def release(self) -> int:
        """Drop what is held; returns how many objects were."""
        with self._lock:
            n = len(self._items)
            self._items.clear()
        return n


# -- the driver side ---------------------------------------------------------------------------------------


def open_for_run(stage: Stage, ctx: RunContext, rewrite: bool = True):
    """A stage's run preamble: the store's group, opened for writing, with every stage ``stage`` requires complete
    in it; ``rewrite``: the stage's own completion flag cleared first, as it is about to rewrite its arrays (an
    interrupted run leaves it unset)."""
    import zarr

    from rapids_attn.store.zarr_store import mark_complete

    g = zarr.open_group(str(ctx.store_path), mode="r+")
    stage.require_complete(g, ctx.store_path)
    if rewrite:
        mark_complete(g, stage.name, False)
    return g


def sample_positions(n: int, groups: list[str], k: int | None, seed: int) -> np.ndarray:
    """Positions of the evaluated examples: not probes, a seeded sample of ``k`` (sorted), or all."""
    pos = np.asarray([i for i in range(n) if not groups[i].startswith("probe:")], dtype=np.int64)
    if k is not None and k < len(pos):
        pos = np.sort(np.random.default_rng(seed).choice(pos, size=k, replace=False))
    return pos


def evaluated_positions(g, k: int | None, seed: int) -> np.ndarray:
    """:func:`sample_positions` over the store's examples (their groups name the probes)."""
    from rapids_attn.store import schema as S

    groups = [str(x) for x in g[S.EXAMPLE_GROUP][:]]
    return sample_positions(len(groups), groups, k, seed)


def shards_of(items: Sequence[T], ctx: RunContext) -> list[Sequence[T]]:
    """``items`` cut into about two tasks per worker of the run's cluster, in order."""
    n_workers = max(1, int(ctx.runtime.get("n_workers", 1)))
    size = max(1, math.ceil(len(items) / (2 * n_workers)))
    return [items[i : i + size] for i in range(0, len(items), size)]


def progress(total: int, desc: str):
    """The progress bar of a stage's tasks, on stderr (drawn only on a terminal)."""
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit="shard",
        file=sys.stderr,
        dynamic_ncols=True,
        disable=None if sys.stderr.isatty() else False,
        mininterval=1.0,
    )


def map_tasks(client, fn: Callable[[Any], T], tasks: Sequence[Any], desc: str) -> list[T]:
    """``fn`` over ``tasks`` on the workers; the results in the tasks' order, counted on a progress bar as they
    come."""
    from distributed import as_completed

    futures = client.map(fn, tasks, pure=False)
    index = {f.key: i for i, f in enumerate(futures)}
    out: list = [None] * len(tasks)
    with progress(len(tasks), desc) as bar:
        for fut in as_completed(futures):
            out[index[fut.key]] = fut.result()
            bar.update(1)
    return out


def stages_for(job, classes: Sequence[type[Stage]]) -> list[Stage]:
    """The stages of ``classes``, in their order, built from ``job`` (:meth:`Stage.from_job`): another model's job,
    whose stages a stage runs inside its own (checked in its ``check``, with that model's context). The calling
    stage names the classes it runs (it imports them; none of them imports it)."""
    return [cls.from_job(job) for cls in classes]


def run_stages(stages: Sequence[Stage], ctx: RunContext, client=None) -> dict[str, Any]:
    """Run ``stages`` (from :func:`stages_for`) in order in ``ctx``, the other model's context (its own run
    directory, store and key), as the pipeline runs a job's: each with the client when it uses the cluster, its
    result timed; returns the results by stage name. The cluster is the calling stage's: nothing is released."""
    import dataclasses
    import time

    sub = dataclasses.replace(ctx, stages=tuple(st.name for st in stages), results={}, timings={})
    for st in stages:
        t = time.perf_counter()
        result = st.run(sub, client if st.uses_cluster(sub) else None)
        result.seconds = sub.timings[st.name] = time.perf_counter() - t
        sub.results[st.name] = result
    return sub.results


def json_safe(x):
    """``x`` with NumPy arrays and scalars as lists and Python numbers, dict keys as strings, and NaN and
    infinities as None (JSON has neither)."""
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if isinstance(x, np.ndarray):
        return json_safe(x.tolist())
    if isinstance(x, (np.floating, float)):
        return None if not math.isfinite(float(x)) else float(x)
    if isinstance(x, np.integer):
        return int(x)
    return x
