"""A new stage is one package plus one registration: a minimal stage defined here (its settings and its Stage class,
nothing edited elsewhere), registered through :func:`rapids_attn.registry.register`, gets its job section (defaults,
validation, one-line errors naming ``<section>.<field>``), its place in ``--stages`` (parsing, help, run order), and
its typed result in the summary; unregistered, the job refuses its section again."""

from dataclasses import dataclass, field

import numpy as np
import pytest
import yaml
import zarr
from helpers import make_job
from pydantic import Field, field_validator

from rapids_attn import registry
from rapids_attn.errors import JobConfigError
from rapids_attn.extract.signature import STAT_NAMES
from rapids_attn.jobfile import load_job
from rapids_attn.pipeline import run_job
from rapids_attn.run import build_parser, main
from rapids_attn.settings import Section
from rapids_attn.stage import RunContext, Stage, StageResult
from rapids_attn.store import schema as S


class HeadStatConfig(Section):
    """The example stage's job section, ``head_stat:``."""

    #: run the stage by default (it always runs when --stages names it).
    enabled: bool = False
    #: which of the stored per-map statistics is averaged per head.
    stat: str = "entropy"
    #: heads reported, highest mean first.
    top: int = Field(2, ge=1)

    @field_validator("stat")
    @classmethod
    def _a_stored_stat(cls, value: str) -> str:
        if value not in STAT_NAMES:
            raise ValueError(f"is not a stored statistic; use one of {', '.join(STAT_NAMES)}")
        return value


@dataclass
class HeadStatResult(StageResult):
    stat: str = ""
    #: (layer, head, mean over the examples), highest first
    top: list = field(default_factory=list)


class HeadStatStage(Stage):
    """Averages one per-map statistic of the extract stage's ``stats`` array per head."""

    name = "head_stat"
    settings = HeadStatConfig
    requires = (S.STATS,)

    def __init__(self, cfg: HeadStatConfig):
        self.cfg = cfg

    @classmethod
    def from_job(cls, cfg) -> "HeadStatStage":
        return cls(cfg.head_stat)

    @classmethod
    def runs_by_default(cls, cfg) -> bool:
        return cfg.head_stat.enabled

    def run(self, ctx: RunContext, client=None) -> HeadStatResult:
        g = zarr.open_group(str(ctx.store_path), mode="r")
        self.require_complete(g, ctx.store_path)
        means = np.nanmean(np.asarray(g[S.STATS][..., STAT_NAMES.index(self.cfg.stat)], dtype=np.float64), axis=0)
        order = np.argsort(-means, axis=None, kind="stable")[: self.cfg.top]
        top = [[int(i // means.shape[1]), int(i % means.shape[1]), float(means.flat[i])] for i in order]
        return HeadStatResult(stat=self.cfg.stat, top=top)


@pytest.fixture
def with_head_stat():
    with registry.registered(HeadStatStage, before="explain"):
        yield
    assert "head_stat" not in registry.registered_stages()


def _job_file(tmp_path, job: dict):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def test_its_section_is_validated_like_a_core_one(tmp_path, tiny_bert_dir, pair_data, with_head_stat):
    raw = make_job(tmp_path, tiny_bert_dir, pair_data)
    cfg = load_job(None, raw=raw)
    assert cfg.head_stat == HeadStatConfig()  # left out: its defaults
    assert "head_stat" not in registry.default_stages(cfg)
    on = load_job(None, raw=raw, overrides=["head_stat.enabled=true", "head_stat.top=3"])
    assert (on.head_stat.enabled, on.head_stat.top) == (True, 3)
    assert registry.default_stages(on) == ("extract", "learn", "head_stat", "explain")
    for override, says in [
        ("head_stat.stat=nope", "job: head_stat.stat: is not a stored statistic; use one of"),
        ("head_stat.top=0", "job: head_stat.top: Input should be greater than or equal to 1"),
        ("head_stat.top=true", "job: head_stat.top: must be a whole number, not true/false"),
        ("head_stat.tpo=3", "job: head_stat.tpo: unknown key; did you mean 'top'?"),
    ]:
        with pytest.raises(JobConfigError) as e:
            load_job(None, raw=raw, overrides=[override])
        assert str(e.value).startswith(says) and "\n" not in str(e.value), (override, str(e.value))


def test_it_runs_in_its_place_and_its_result_lands_in_the_summary(
    tmp_path, tiny_bert_dir, pair_data, with_head_stat, capsys
):
    cfg = load_job(None, raw=make_job(tmp_path, tiny_bert_dir, pair_data, head_stat={"stat": "entropy", "top": 3}))
    stages = registry.parse_stages("head_stat,extract", cfg)  # run in the registry's order, whatever the order written
    assert stages == ("extract", "head_stat")
    summary = run_job(cfg, stages)
    assert summary["stages"] == ["extract", "head_stat"]
    g = zarr.open_group(str(cfg.run_dir / "store.zarr"), mode="r")
    means = np.asarray(g[S.STATS][..., STAT_NAMES.index("entropy")], dtype=np.float64).mean(axis=0)
    got = summary["head_stat"]
    assert got["stat"] == "entropy" and len(got["top"]) == 3
    layer, head, value = got["top"][0]
    assert value == pytest.approx(means.max()) and means[layer, head] == pytest.approx(value)
    assert [t[2] for t in got["top"]] == sorted((t[2] for t in got["top"]), reverse=True)
    err = capsys.readouterr().err
    assert err.index("rapids_attn: extract: done in ") < err.index("rapids_attn: head_stat: started")
    assert "rapids_attn: head_stat: done in " in err and "rapids_attn: preflight: done in " in err


def test_the_cli_knows_it_while_registered_and_not_after(tmp_path, tiny_bert_dir, pair_data, capsys):
    job = make_job(tmp_path, tiny_bert_dir, pair_data)
    path = _job_file(tmp_path, job)
    with registry.registered(HeadStatStage, before="explain"):
        help_text = "".join(build_parser().format_help().split())  # argparse wraps it anywhere
        assert f"subsetof{','.join(registry.registered_stages())},runinthatorder" in help_text
        assert ",head_stat,explain," in help_text and "head_stat.enabled" in help_text  # runs when enabled
        assert main([str(path), "--stages", "head_stat,extract", "--set", "head_stat.top=1"]) == 0
        run = capsys.readouterr()
        assert "stages extract,head_stat" in run.out
        assert run.err.index("rapids_attn: extract: done in ") < run.err.index("rapids_attn: head_stat: started")
        assert main([str(path), "--stages", "head_stat", "--set", "head_stat.stat=nope"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: {path}: head_stat.stat: is not a stored statistic"), err
        assert err.count("\n") == 0
    assert "head_stat" not in registry.registered_stages()
    assert main([str(path), "--stages", "head_stat"]) == 2
    assert "unknown stage 'head_stat'" in capsys.readouterr().err
    with pytest.raises(JobConfigError, match="head_stat: unknown key"):
        load_job(None, raw={**job, "head_stat": {"top": 1}})


def test_registering_refuses_a_clash():
    before = list(registry.registered_stages())
    with pytest.raises(ValueError, match="registered already"):
        registry.register(registry.registered_stages()["learn"])
    with pytest.raises(ValueError, match="no such stage"):
        registry.register(HeadStatStage, before="nope")

    class Clash(HeadStatStage):
        name = "clash"
        section = "heads"

    with pytest.raises(ValueError, match="belongs to another registered stage"):
        registry.register(Clash)

    class Core(HeadStatStage):
        name = "core"
        section = "model"

    with pytest.raises(ValueError, match="core section"):
        registry.register(Core)
    assert list(registry.registered_stages()) == before
