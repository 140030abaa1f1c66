"""The stage contract: a new stage is one class plus its entry in the pipeline's list. Its check runs
in preflight, its requirements are checked against the run and the store, the pipeline starts the
cluster only for the stages that use it, and its typed result lands in summary.json."""

import json
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest
import zarr
from helpers import make_job

from rapids_attn import pipeline
from rapids_attn.errors import JobConfigError, StoreError
from rapids_attn.job import load_job
from rapids_attn.stage import RunContext, Stage, StageResult
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
def with_stages(monkeypatch):
    stages = dict(pipeline.STAGES, count=CountStage, on_workers=WorkersStage)
    monkeypatch.setattr(pipeline, "STAGES", stages)
    CountStage.calls = []
    return stages


def test_a_new_stage_runs_after_the_others_and_reports(tmp_path, tiny_bert_dir, pair_data, with_stages):
    cfg = load_job(None, raw=make_job(tmp_path, tiny_bert_dir, pair_data))
    summary = pipeline.run_job(cfg, pipeline.parse_stages("extract,learn,explain,count"))
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
    assert released == [True]  # on the CPU, the learn stage's KMeans sweep and refits run on the workers
    released.clear()
    raw = make_job(tmp_path / "plain", tiny_bert_dir, pair_data)
    raw["cluster"] = {**raw.get("cluster", {}), "k_sweep": None, "stability_seeds": 0}
    pipeline.run_job(load_job(None, raw=raw), ("extract", "learn"))
    assert released == []  # no extra fits: the cluster closed right after extract instead
