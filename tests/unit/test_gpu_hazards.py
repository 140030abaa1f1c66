"""The GPU first-run hazards (issue 47, item 5): the catalogue.

Issue 47 read cuML 26.10, dask-cuda 26.10 and the RAPIDS image against the code. Each hazard it found is either
made safe in code, with a test here that needs no GPU, or listed in docs/deployment.md's "The first GPU run" as
what the first GPU run must check, in the order it should check it. Some are both. :data:`HAZARDS` says which;
:func:`test_every_hazard_is_in_the_catalogue_and_the_docs` holds the docs to it.
"""

import gc
import re
import weakref
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import learn_sections, planted_store

import rapids_attn.learn.fit as fit_mod
from rapids_attn import devices
from rapids_attn.backends.learn import CuML, LearnBackend

REPO = Path(__file__).resolve().parents[2]
DEPLOYMENT = REPO / "docs" / "deployment.md"

#: (hazard, the test here that covers it in code or None, the step of deployment.md's "The first GPU run" that
#: checks it on a GPU or None). The steps must appear in the docs in this order.
HAZARDS = [
    (
        "CUDA 13.x image vs torch's 13.0 pins; NVRTC (JIT) and NCCL not seen by `gpu_stack.py check`",
        None,
        "**The CUDA libraries in one process.**",
    ),
    (
        "MIG slices told apart by UUID would start NCCL across slices",
        "test_workers_on_mig_slices_get_no_spread_fit",
        "**The GPU each worker names.**",
    ),
    (
        "the fine-tune's Trainer and torch's cache on GPU 0 before worker 0 asks for 80% of it",
        "test_the_fine_tunes_memory_is_freed_before_the_cluster_starts",
        "**The fine-tune, then the cluster.**",
    ),
    (
        "the one-GPU fit goes to any GPU worker (the scheduler picks), not 'the first worker with a GPU'",
        "test_the_one_gpu_fit_is_offered_to_every_gpu_worker_and_names_the_one_that_ran_it",
        "**The one-GPU fit on a worker, and UMAP's seed.**",
    ),
    (
        "a fixed random_state takes cuML UMAP's slower reproducible path; NN Descent above 50K rows",
        "test_umap_gets_the_seed_and_the_docs_say_what_it_costs",
        "**The one-GPU fit on a worker, and UMAP's seed.**",
    ),
    (
        "the spread fit leaves a CUDA context and fitted arrays in the job process on GPU 0",
        "test_no_comment_says_the_job_process_allocates_nothing_on_the_gpu",
        "**The spread fit, on two or more whole GPUs.**",
    ),
    ("HDBSCAN's prediction_data=True built and never used", "test_hdbscan_builds_no_prediction_data", None),
    (
        "deployment.md's 'every GPU call is also checked against the real RAPIDS wheels' overstated the contract tier",
        "test_the_docs_say_what_the_contract_tier_checks",
        None,
    ),
]


def _words(text: str) -> str:
    """Markdown as running text: block-quote marks and line breaks gone, spaces single."""
    return re.sub(r"\s+", " ", " ".join(re.sub(r"^\s*>\s?", "", line) for line in text.splitlines()))


def _first_run_section() -> str:
    text = DEPLOYMENT.read_text()
    start = text.index("## 8. The first GPU run: what to check, in order")
    return text[start : text.index("\n## ", start + 1)]


def test_every_hazard_is_in_the_catalogue_and_the_docs():
    """Every hazard is covered by a test of this module or a step of the first GPU run; the steps appear in the
    docs in the catalogue's order, numbered; every test named exists."""
    section = _first_run_section()
    where = []
    for hazard, test, step in HAZARDS:
        assert test or step, hazard
        if test:
            assert callable(globals().get(test)), test
        if step:
            assert step in section, step
            where.append(section.index(step))
    assert where == sorted(where)
    numbered = re.findall(r"^(\d+)\. \*\*", section, flags=re.MULTILINE)
    assert numbered == [str(i) for i in range(1, len(numbered) + 1)] and len(numbered) >= 6
    assert "test_gpu_hazards.py" in section


# -- the fine-tune's memory, freed before the cluster starts ---------------------------------------------------


def test_the_fine_tunes_memory_is_freed_before_the_cluster_starts(tmp_path, monkeypatch):
    """The order of events through the pipeline: each fine-tune (here a stand-in whose "Trainer" sits in a reference
    cycle, as HF's does), then its memory freed (the cycle collected, torch's CUDA cache emptied), and only then the
    cluster start, for the first stage that uses it. The collector is off during the run, so only the stage's own
    collection can free the cycle."""
    import torch

    from rapids_attn import pipeline
    from rapids_attn.finetune import split as split_mod
    from rapids_attn.finetune.stage import FinetuneResult, FinetuneStage
    from rapids_attn.stage import RunContext, Stage, StageResult

    events, trainers = [], []

    class Trainer:  # holds itself, as Trainer, its callbacks and accelerate's wrappers hold each other
        def __init__(self):
            self.me = self

    def one(self, ctx, run, split):
        trainer = Trainer()
        trainers.append(weakref.ref(trainer))
        events.append(f"fine-tune {run.label}")
        return FinetuneResult(folder=str(tmp_path / run.label))

    def emptied():
        events.append(f"cuda cache emptied ({sum(t() is not None for t in trainers)} trainer(s) alive)")

    class OnTheCluster(Stage):
        name = "on-the-cluster"

        @classmethod
        def from_job(cls, cfg):
            return cls()

        def uses_cluster(self, ctx):
            return True

        def run(self, ctx, client=None):
            events.append(f"stage on the cluster (client {client})")
            return StageResult()

    def start(cfg, ctx, scope):
        events.append(f"cluster start ({sum(t() is not None for t in trainers)} trainer(s) alive)")
        return "the client"

    monkeypatch.setattr(FinetuneStage, "_one", one)
    monkeypatch.setattr(split_mod, "job_split", lambda cfg: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on a GPU node, CUDA initialised
    monkeypatch.setattr(torch.cuda, "empty_cache", emptied)
    monkeypatch.setattr(pipeline, "_start_cluster", start)
    cfg = SimpleNamespace(finetune=SimpleNamespace(seed=0, control_seeds=[1], shuffled_labels=False))
    ctx = RunContext(tmp_path, {}, "t", None, None, None, "key", None, 0, ("finetune", OnTheCluster.name))
    plan = pipeline.RunPlan(ctx, [FinetuneStage(cfg), OnTheCluster()])
    gc.disable()
    try:
        pipeline._run_stages(cfg, plan)
    finally:
        gc.enable()
    assert events == [
        "fine-tune finetuned",
        "cuda cache emptied (0 trainer(s) alive)",
        "fine-tune finetuned-seed1",
        "cuda cache emptied (0 trainer(s) alive)",
        "cluster start (0 trainer(s) alive)",
        "stage on the cluster (client the client)",
    ]


# -- MIG: no spread fit across slices --------------------------------------------------------------------------


class FakeNVML:
    """pynvml's calls, answering for the devices given: ``devices`` maps a UUID NVIDIA-style (``MIG-...`` or
    ``GPU-...``) to ``"slice"``, ``"mig-mode"`` (a GPU in MIG mode), ``"whole"`` or ``"no-mig-support"``."""

    class NVMLError(Exception):
        pass

    def __init__(self, devices, init_fails=False):
        self.devices, self.init_fails, self.open = devices, init_fails, 0

    def nvmlInit(self):
        if self.init_fails:
            raise self.NVMLError("NVML Shared Library Not Found")
        self.open += 1

    def nvmlShutdown(self):
        self.open -= 1

    def nvmlDeviceGetHandleByUUID(self, name):
        name = name.decode()
        if name not in self.devices:
            raise self.NVMLError("Not Found")
        return name

    def nvmlDeviceIsMigDeviceHandle(self, handle):
        return int(self.devices[handle] == "slice")

    def nvmlDeviceGetMigMode(self, handle):
        if self.devices[handle] == "no-mig-support":
            raise self.NVMLError("Not Supported")
        return (int(self.devices[handle] == "mig-mode"), 0)


U = "0aa5d7b3-1111-2222-3333-444455556666"  # torch prints a device UUID bare: no GPU- or MIG- prefix


@pytest.mark.parametrize(
    ("visible", "nvml", "name"),
    [
        ("", None, f"GPU-{U}"),  # no sign of a slice, no NVML: a whole GPU
        ("0", FakeNVML({f"GPU-{U}": "whole"}), f"GPU-{U}"),
        ("0", FakeNVML({f"GPU-{U}": "no-mig-support"}), f"GPU-{U}"),  # a GPU that cannot do MIG
        (f"MIG-{U}", None, f"MIG-{U}"),  # dask-cuda's worker on a slice: its entry names it
        ("", FakeNVML({f"MIG-{U}": "slice"}), f"MIG-{U}"),  # a container given one slice: only NVML knows
        ("", FakeNVML({f"GPU-{U}": "mig-mode"}), f"MIG-{U}"),  # CUDA reporting the card's UUID for a slice
        ("", FakeNVML({}, init_fails=True), f"GPU-{U}"),  # no NVML library: no answer, a whole GPU
        ("", FakeNVML({}), f"GPU-{U}"),  # NVML does not know it
    ],
)
def test_a_worker_names_its_gpu_as_nvidia_does(visible, nvml, name):
    assert devices.nvidia_gpu_name(U, visible, nvml) == name
    if nvml is not None:
        assert nvml.open == 0  # every nvmlInit shut down again
    assert devices.nvidia_gpu_name(f"GPU-{U}", f"MIG-{U}", None) == f"GPU-{U}"  # an NVIDIA name is kept as it is


def test_workers_on_mig_slices_get_no_spread_fit(tmp_path, monkeypatch, capsys):
    """Fake worker descriptions: two workers on slices of one card (their own UUIDs, so two "distinct GPUs") get no
    spread fit, which would run NCCL across the slices; the fit runs where a one-GPU fit would (here, scikit-learn:
    in this process), and summary.json and the learn stage say why in one line."""
    from rapids_attn.learn.stage import LearnStage

    ids = {"tcp://a:1": "MIG-aaaa", "tcp://b:1": "MIG-bbbb", "tcp://c:1": None}
    assert devices.mig_workers(ids) == ["tcp://a:1", "tcp://b:1"]
    assert devices.one_worker_per_gpu(ids) == ["tcp://a:1", "tcp://b:1"]  # two GPUs by name: MIG must stop it
    assert devices.mig_workers({"tcp://a:1": "GPU-a", "tcp://b:1": "GPU-b", "tcp://c:1": None}) == []

    g, _ = planted_store(tmp_path)
    reduce, cluster = learn_sections()
    monkeypatch.setattr(fit_mod, "gpu_ids", lambda c: ids)
    info = fit_store_with(g, reduce, cluster, client=object())  # a spread fit would use the client: it must not
    assert info["multi_gpu"] is False and info["fit_worker"] is None
    assert info["multi_gpu_skipped"] == (
        "2 worker(s) run on MIG slices, and NCCL (cuml.dask's fit) does not run across MIG slices: "
        "fitted on one GPU worker"
    )
    monkeypatch.setattr(fit_mod, "gpu_ids", lambda c: {"tcp://a:1": "MIG-aaaa"})  # one slice: one GPU, as before
    assert fit_store_with(g, reduce, cluster, client=object())["multi_gpu_skipped"] == (
        "1 distinct GPU(s) among the workers"
    )

    # the learn stage prints the note in one line
    import rapids_attn.stagekit
    import rapids_attn.store.zarr_store

    monkeypatch.setattr(rapids_attn.stagekit, "open_for_run", lambda *a, **k: None)
    monkeypatch.setattr(rapids_attn.store.zarr_store, "consolidate", lambda path: None)
    monkeypatch.setattr(fit_mod, "fit_store", lambda *a, **k: info)
    backend = LearnBackend("cuml", "test")
    ctx = SimpleNamespace(devices=SimpleNamespace(learn=backend, multi_gpu_learn=True), store_path=tmp_path)
    LearnStage(reduce, cluster, cluster_kind="local-cuda").run(ctx, client=object())
    err = capsys.readouterr().err.splitlines()
    assert err == [f"rapids_attn: learn: not spread over the GPUs: {info['multi_gpu_skipped']}"]


def fit_store_with(g, reduce, cluster, client):
    return fit_mod.fit_store(g, reduce, cluster, LearnBackend("sklearn", "test"), seed=0, client=client, multi_gpu=True)


# -- the one-GPU fit: any GPU worker ---------------------------------------------------------------------------


def test_the_one_gpu_fit_is_offered_to_every_gpu_worker_and_names_the_one_that_ran_it(tmp_path, monkeypatch):
    """The fit's task goes to the scheduler with every GPU worker allowed (one per distinct GPU), so the scheduler
    may run it on any of them: the summary names the worker that did, not "the first worker with a GPU"."""
    ids = {"tcp://b:1": "GPU-2", "tcp://a:1": "GPU-1", "tcp://a:2": "GPU-1", "tcp://c:1": None}
    submitted = []

    class Client:
        def submit(self, fn, *args, workers, pure):
            submitted.append((fn.__name__, workers))
            return SimpleNamespace(result=lambda: {"fit_worker": "tcp://b:1"})  # the scheduler took the second

    monkeypatch.setattr(fit_mod, "gpu_ids", lambda c: ids)
    reduce, cluster = learn_sections()
    g = SimpleNamespace(store="the store")  # the worker opens the store itself
    info = fit_mod.fit_store(g, reduce, cluster, SimpleNamespace(gpu=True), client=Client())
    assert submitted == [("_fit_store_on_worker", ["tcp://a:1", "tcp://b:1"])]  # one per GPU, none without one
    assert info["fit_worker"] == "tcp://b:1"
    docs = _words(DEPLOYMENT.read_text())
    assert "the first worker with a GPU" not in docs
    assert "the scheduler runs it on any one of them" in docs
    assert "the first with a GPU" not in fit_mod.fit_worker.__doc__


# -- UMAP's seed -----------------------------------------------------------------------------------------------


def test_umap_gets_the_seed_and_the_docs_say_what_it_costs(monkeypatch):
    """UMAP is built with the job's seed on both libraries (no setting leaves it off), and the docs say what that
    costs on cuML; tests/contract reads cuML's own documentation of it off the 26.10 wheel."""
    built = {}
    monkeypatch.setattr(CuML, "estimator_class", classmethod(lambda cls, what: lambda **kw: built.update(kw)))
    CuML.umap(2, 15, 0.1, "euclidean", 7)
    assert built["random_state"] == 7
    docs = _words(DEPLOYMENT.read_text())
    assert "UMAP's seed costs speed." in docs and "NN Descent" in docs and "50,000 rows" in docs


# -- the spread fit's job process ------------------------------------------------------------------------------


def test_no_comment_says_the_job_process_allocates_nothing_on_the_gpu():
    """The job process of a spread fit holds a CUDA context and small fitted arrays (cuml.dask's client code, its
    KMeans.fit pulling the first worker's model, get_combined_model): no comment or doc says otherwise, and the
    module that drives cuml.dask and the deployment docs say so."""
    for path in [*sorted((REPO / "rapids_attn").rglob("*.py")), *sorted((REPO / "docs").glob("*.md"))]:
        assert "allocates nothing" not in path.read_text(), path
    spread = (REPO / "rapids_attn" / "learn" / "spread.py").read_text()
    assert "holds a CUDA context" in spread and "get_combined_model" in spread
    assert "What the job process holds." in _words(DEPLOYMENT.read_text())


# -- HDBSCAN builds no prediction data -------------------------------------------------------------------------


def test_hdbscan_builds_no_prediction_data(monkeypatch):
    """Nothing predicts with HDBSCAN (maps outside the fit sample take their nearest fitted neighbour's label), so
    cuML's HDBSCAN is built without prediction data, as scikit-learn's is."""
    built = {}
    monkeypatch.setattr(CuML, "estimator_class", classmethod(lambda cls, what: lambda **kw: built.update(kw)))
    CuML.hdbscan(50, 10)
    assert built == {"min_cluster_size": 50, "min_samples": 10}
    for path in sorted((REPO / "rapids_attn").rglob("*.py")):
        text = path.read_text()
        assert "prediction_data" not in text and "approximate_predict" not in text, path


# -- what the contract tier checks -----------------------------------------------------------------------------


def test_the_docs_say_what_the_contract_tier_checks():
    docs = _words(DEPLOYMENT.read_text())
    assert "every gpu call is also checked against the real rapids wheels" not in docs.lower()
    assert "That catches a renamed or removed argument or function. It does not catch" in docs
