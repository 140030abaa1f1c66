"""The stage contract: a new stage is one class plus its entry in the one registry (:mod:`rapids_attn.registry`). Its
check runs in preflight, its requirements are checked against the run and the store, the pipeline starts the
cluster only for the stages that use it, and its typed result lands in summary.json. A stage that runs on the
workers has its worker modules preloaded by their fork server, and one with a report section is reported by the
explain stage (summary.json and report/index.html): all from the class's own declarations, no other list edited."""

import json
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest
import zarr
from helpers import make_job

from rapids_attn import pipeline, registry
from rapids_attn.errors import JobConfigError, StoreError
from rapids_attn.jobfile import load_job
from rapids_attn.stage import ReportSection, RunContext, Stage, StageResult
from rapids_attn.store import schema as S


@dataclass
class CountResult(StageResult):
    maps_per_cluster: dict | None = None


class CountStage(Stage):
    """A toy analysis stage: counts the maps of each cluster (reads the learn stage's array)."""

    name = "count"
    requires = (S.CLUSTER,)
    calls: ClassVar[list] = []  # what the pipeline called, in order (reset by the fixture)

    def __init__(self, seed: int):
        self.seed = seed

    @classmethod
    def from_job(cls, cfg) -> "CountStage":
        return cls(cfg.runtime.seed)

    def check(self, ctx: RunContext) -> None:
        CountStage.calls.append(("check", ctx.layout.n_examples))
        if ctx.layout.n_examples < 2:
            raise JobConfigError("count: needs at least two examples")

    def uses_cluster(self, ctx: RunContext) -> bool:
        return False

    def run(self, ctx: RunContext, client=None) -> CountResult:
        CountStage.calls.append(("run", client))
        g = zarr.open_group(str(ctx.store_path), mode="r")
        ids, n = np.unique(np.asarray(g[S.CLUSTER][:]), return_counts=True)
        return CountResult(maps_per_cluster={str(i): int(c) for i, c in zip(ids, n)})


class WorkersStage(CountStage):
    """Like count, but runs on the Dask workers: the pipeline keeps the cluster up for it."""

    name = "on_workers"

    def uses_cluster(self, ctx: RunContext) -> bool:
        return True

    def run(self, ctx: RunContext, client=None) -> CountResult:
        assert client is not None
        CountStage.calls.append(("run-on-workers", len(client.scheduler_info()["workers"])))
        return CountResult(maps_per_cluster={})


@pytest.fixture
def with_stages():
    CountStage.calls = []
    with registry.registered(CountStage, WorkersStage):
        yield registry.registered_stages()
    assert "count" not in registry.registered_stages()


def test_a_new_stage_runs_after_the_others_and_reports(tmp_path, tiny_bert_dir, pair_data, with_stages):
    cfg = load_job(None, raw=make_job(tmp_path, tiny_bert_dir, pair_data))
    summary = pipeline.run_job(cfg, registry.parse_stages("extract,learn,explain,count"))
    assert CountStage.calls[0] == ("check", 20)  # preflight, before anything ran
    assert CountStage.calls[1] == ("run", None)  # no cluster for a stage that does not use it
    counts = summary["count"]["maps_per_cluster"]
    assert sum(counts.values()) == 20 * 2 * 2
    assert json.loads((cfg.run_dir / "summary.json").read_text())["count"] == summary["count"]
    assert set(summary["seconds"]) >= {"preflight", "extract", "learn", "explain", "count"}

    # run alone later: its requirement is met by the store's complete learn stage
    CountStage.calls = []
    alone = pipeline.run_job(cfg, ("count",))
    assert alone["count"]["maps_per_cluster"] == counts and alone["stages"] == ["count"]


def test_requirements_and_checks_fail_before_any_worker_starts(
    tmp_path, tiny_bert_dir, pair_data, with_stages, monkeypatch
):
    cfg = load_job(None, raw=make_job(tmp_path, tiny_bert_dir, pair_data))
    started = []
    monkeypatch.setattr(pipeline, "_start_cluster", lambda *a: started.append(a))
    with pytest.raises(StoreError, match="run the extract stage first"):
        pipeline.run_job(cfg, ("count",))
    raw = make_job(tmp_path / "one", tiny_bert_dir, pair_data)
    raw["data"]["limit"] = 1
    cfg1 = load_job(None, raw=raw)
    with pytest.raises(JobConfigError, match="count: needs at least two examples"):
        pipeline.run_job(cfg1, ("extract", "learn", "count"))
    assert started == [] and not (tmp_path / "one" / "run").exists()


def test_the_cluster_lives_until_the_last_stage_that_uses_it(
    tmp_path, tiny_bert_dir, pair_data, with_stages, monkeypatch
):
    from rapids_attn.extract.stage import ExtractStage

    released = []
    monkeypatch.setattr(ExtractStage, "release", lambda self, client: released.append(client is not None))
    cfg = load_job(None, raw=make_job(tmp_path, tiny_bert_dir, pair_data))
    pipeline.run_job(cfg, ("extract", "learn", "on_workers"))
    assert ("run-on-workers", 1) in CountStage.calls
    assert released == [True]  # the workers dropped extract's model before the later stage
    released.clear()
    pipeline.run_job(cfg, ("extract", "learn"))
    assert released == []  # a CPU learn stage (its k sweep and refits too) runs here: closed right after extract


# -- the whole path: registered once, run on the workers (their preload), reported by explain -------------------

#: a module nothing of the job imports: present in a worker only when the fork server preloaded it
TOY_MODULE = "netrc"


class TallySection(ReportSection):
    """The toy stage's report section: its counts in summary.json and a section of report/index.html."""

    anchor = "tally"
    title = "Maps per cluster (tally)"

    def read(self, g, summary, findings, arrays, earlier):
        from rapids_attn.store.zarr_store import complete_attr

        info = g.attrs.get("tally") if g.attrs.get(complete_attr("tally")) else None
        if info:
            summary["cluster_sizes"] = dict(info["maps_per_cluster"])
        return info

    def html(self, state, figures):
        if not state:
            return ""
        rows = "".join(f"<tr><td>{c}</td><td>{n}</td></tr>" for c, n in state["maps_per_cluster"].items())
        return f'<section id="tally"><h2>Maps per cluster</h2><table>{rows}</table></section>'


@dataclass
class TallyResult(StageResult):
    maps_per_cluster: dict | None = None


class TallyStage(Stage):
    """A toy stage that runs on the workers and is reported by explain: it counts the maps of each cluster in a
    worker task, which also says whether its declared worker module was there before the task ran."""

    name = "tally"
    requires = (S.CLUSTER,)
    runs_on_workers = True
    worker_modules = (TOY_MODULE,)
    summarised = True  # its report section puts its counts into summary.json
    seen: ClassVar[list] = []  # (module preloaded, worker's parent pid) per run

    @classmethod
    def report_section(cls):
        return TallySection()

    @classmethod
    def from_job(cls, cfg) -> "TallyStage":
        return cls()

    def uses_cluster(self, ctx: RunContext) -> bool:
        return True

    def run(self, ctx: RunContext, client=None) -> TallyResult:
        from rapids_attn.stagekit import open_for_run
        from rapids_attn.store.zarr_store import mark_complete

        g = open_for_run(self, ctx)

        def count(path, module):  # on a worker (pickled by value: it imports nothing of the tests)
            import os
            import sys

            preloaded = module in sys.modules
            ids, n = np.unique(np.asarray(zarr.open_group(path, mode="r")[S.CLUSTER][:]), return_counts=True)
            return {str(i): int(c) for i, c in zip(ids, n)}, preloaded, os.getppid()

        counts, preloaded, parent = client.submit(count, str(ctx.store_path), TOY_MODULE, pure=False).result()
        TallyStage.seen.append((preloaded, parent))
        mark_complete(g, self.name, True, {"maps_per_cluster": counts})
        return TallyResult(maps_per_cluster=counts)


@pytest.fixture
def with_tally(monkeypatch):
    """The toy stage registered in the one place, before explain; a fork server of its own for the test."""
    from multiprocessing import forkserver

    import rapids_attn.processes as rt_mod

    TallyStage.seen = []
    rt_mod.stop_worker_server()
    if getattr(forkserver._forkserver, "_forkserver_pid", None) is not None:
        forkserver._forkserver._stop()  # whatever an earlier test left running: a server of this test's start
    monkeypatch.setattr(rt_mod, "_server_env", None)
    monkeypatch.setattr(rt_mod, "_server_pid", None)
    with registry.registered(TallyStage, before="explain"):
        yield registry.registered_stages()
    rt_mod.stop_worker_server()  # later tests start one with the real stages' modules


def test_a_stage_registered_once_runs_on_the_workers_and_is_reported(tmp_path, tiny_bert_dir, pair_data, with_tally):
    from multiprocessing import forkserver

    from rapids_attn.registry import worker_modules, worker_stages

    assert "tally" in worker_stages() and worker_modules()[-2:] == (TOY_MODULE, "rapids_attn._fork_ready")
    raw = make_job(tmp_path, tiny_bert_dir, pair_data, explain={"report": True})
    raw["runtime"]["processes"] = True  # worker processes, forked from the fork server
    cfg = load_job(None, raw=raw)
    assert registry.default_stages(cfg) == ("extract", "learn", "tally", "explain")
    summary = pipeline.run_job(cfg, ("extract", "learn", "tally", "explain"))

    [(preloaded, parent)] = TallyStage.seen
    assert preloaded  # the fork server imported the stage's worker module before the worker forked
    assert parent == forkserver._forkserver._forkserver_pid
    # reported by explain: its section's summary entry, not its result again under its name (summarised)
    assert sum(summary["cluster_sizes"].values()) == 20 * 2 * 2
    assert "tally" not in summary
    assert json.loads((cfg.run_dir / "summary.json").read_text())["cluster_sizes"] == summary["cluster_sizes"]
    page = (cfg.run_dir / "report" / "index.html").read_text(encoding="utf-8")
    assert '<section id="tally"><h2>Maps per cluster</h2>' in page
    assert '<a href="#tally">Maps per cluster (tally)</a>' in page
    assert page.index('href="#tally"') < page.index('href="#clusters"')
    assert set(summary["seconds"]) >= {"preflight", "extract", "learn", "tally", "explain"}


def test_the_registry_is_read_without_torch():
    """The CLI reads the registry (which stages run on the workers, what they preload) before it starts the
    workers' fork server, so that the server's imports run beside the job's own: the stages' modules must not
    import torch at their top (1.5 s of a 2-core machine)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from rapids_attn.registry import worker_modules\n"
        "from rapids_attn.registry import worker_stages\n"
        "assert 'extract' in worker_stages() and worker_modules()\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
