"""A campaign's runs on one shared Dask cluster (``run --dask ADDRESS|local[:N]``; issue 50, docs/campaigns.md).

Each run is one Dask task that calls :func:`rapids_attn.campaign.tasks.run_task` on a worker, the same code path
as in sequence, ``--parallel`` and a batch array's ``--index``: the worker starts the run's
``python -m rapids_attn.run`` process and writes its record and log, so the records, logs and states are the
other modes' (the record also names the worker). A failing run, or a lost worker, stops nothing else; each run's
line is printed as it ends.

**One run per worker at a time.** Each task asks for one unit of the worker resource :data:`SLOT`
(``campaign-slot``); a worker has one (``local`` starts its workers so, and on a joined cluster a worker started
without it gets it from the :class:`CampaignSlot` plugin), so however many threads a worker has, it runs one run
at a time, and the cluster runs as many at once as it has workers.

**Each run inside its worker's allotment.** The run starts a Dask cluster of its own (its job's ``runtime``),
sized to the worker, through overrides added after the run's (not part of what the run is: its spec hash and its
run directory stay the same in every mode), unless the campaign sets ``runtime.cluster`` itself:

- CPU (no ``--gpus``): ``runtime.cluster=local``, ``runtime.n_workers`` = the worker's share of its machine's
  CPUs (the CPUs the worker may run on / the campaign's workers on that host), one thread each;
- ``--gpus G``: the worker's GPU group is the first ``G`` entries of its ``CUDA_VISIBLE_DEVICES``; the run gets
  ``CUDA_VISIBLE_DEVICES`` = that group and ``runtime.cluster=local-cuda``, ``runtime.n_workers=G``, so it sees
  only its GPUs. ``dask cuda worker`` (or dask-cuda's ``LocalCUDACluster``) gives each worker one GPU, first in
  its list: ``--gpus 1``; a group of several is a worker started with exactly those visible
  (``CUDA_VISIBLE_DEVICES=0,1 dask worker ...``), and ``local:N --gpus G`` starts its workers so. Before
  anything is submitted, two workers of one host whose groups share a GPU are refused in one line.

The variables distributed's nannies write into a worker's environment (``OMP_NUM_THREADS=1``,
``MALLOC_TRIM_THRESHOLD_``, ...: ``distributed.nanny.pre-spawn-environ``) are taken out of the run's, where they
hold the nanny's value: the run's own process would otherwise fit with one thread, and its workers would lose
glibc's malloc tuning (:func:`rapids_attn.processes.worker_allocator_env`).

**Where.** ``local[:N]``: a LocalCluster of ``N`` single-threaded worker processes here (default: one per 4 CPUs,
at most 8; with ``--gpus G``, one per G visible GPUs), TLS between them with credentials of its own as a job's
local cluster (:func:`rapids_attn.runtime.cluster_security`). An address (``tls://host:8786``) or a scheduler
file joins an existing cluster with the project's own joining code (:func:`rapids_attn.runtime.join_scheduler`):
its TLS credentials are ``--tls FOLDER`` (:mod:`rapids_attn.tls`) or the Dask config's, and a plain ``tcp://``
scheduler is refused unless ``--plain-tcp`` (its workers run whatever reaches it). The campaign file, its models
and its output folder must be on storage every worker sees, as for a batch scheduler.

Ctrl-C cancels the runs not started and terminates the started ones (SIGTERM to the run processes this campaign
started on each worker: they keep their finished shards, and their records say ``terminated``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from distributed import LocalCluster, WorkerPlugin

from rapids_attn.campaign.plan import Campaign, Run
from rapids_attn.devices import visible_gpu_names
from rapids_attn.errors import UserError

#: the worker resource a run takes: one per worker, so one run per worker at a time
SLOT = "campaign-slot"
#: set in each run process's environment (the campaign's id), so that Ctrl-C can find and stop them
MARK = "RAPIDS_ATTN_CAMPAIGN_TASK"
#: how long a joined cluster without workers is waited for
WAIT_FOR_WORKERS_S = 120


@dataclass(frozen=True)
class Target:
    """Where the runs go: a local cluster (``address`` and ``scheduler_file`` None) or an existing one."""

    address: str | None = None
    scheduler_file: Path | None = None
    n_workers: int | None = None  # local only: None is the default
    gpus: int = 0  # GPUs per run (0: CPU runs)
    tls: Path | None = None
    plain_tcp: bool = False
    processes: bool = True  # local only: worker processes (threads: for tests)

    @property
    def local(self) -> bool:
        return self.address is None and self.scheduler_file is None


def parse_target(
    text: str, gpus: int = 0, tls: Path | None = None, plain_tcp: bool = False, processes: bool = True
) -> Target:
    """``--dask``'s value: ``local``, ``local:N``, a scheduler's address, or the JSON file ``dask scheduler
    --scheduler-file`` writes. A one-line UserError for a value that is none of them."""
    text = text.strip()
    if gpus < 0:
        raise UserError("--gpus: GPUs per run, 1 or more")
    if text == "local" or text.startswith("local:"):
        if tls is not None or plain_tcp:
            raise UserError("--tls / --plain-tcp: only for joining a scheduler; a local cluster makes its own TLS")
        n = None
        if text != "local":
            try:
                n = int(text.split(":", 1)[1])
            except ValueError:
                n = 0
            if n < 1:
                raise UserError(f"--dask {text}: local:N takes a number of workers, 1 or more (local:2)")
        return Target(n_workers=n, gpus=gpus, processes=processes)
    if "://" not in text and (text.endswith(".json") or Path(text).expanduser().is_file()):
        return Target(scheduler_file=Path(text).expanduser(), gpus=gpus, tls=tls, plain_tcp=plain_tcp)
    if not text or " " in text:
        raise UserError(f"--dask {text!r}: give local, local:N, a scheduler's address (tls://host:8786) or file")
    return Target(address=text, gpus=gpus, tls=tls, plain_tcp=plain_tcp)


def runtime_config(target: Target):
    """The job ``runtime`` section the project joins (or starts) a cluster with, for ``target``'s checks: TLS and
    plain TCP are the job's rules (:class:`rapids_attn.job.RuntimeConfig`), in the job's one-line words."""
    from pydantic import ValidationError

    from rapids_attn.job import RuntimeConfig

    fields = (
        {"cluster": "local", "processes": target.processes, "dashboard_address": "127.0.0.1:0"}
        if target.local
        else {
            "cluster": "scheduler",
            "address": target.address,
            "scheduler_file": target.scheduler_file,
            "tls": target.tls,
            "plain_tcp": target.plain_tcp,
        }
    )
    try:
        return RuntimeConfig(**fields)
    except ValidationError as e:
        err = e.errors()[0]
        msg = str(err.get("msg", e)).removeprefix("Value error, ")
        msg = msg.replace("give runtime.tls: FOLDER", "give --tls FOLDER").replace(
            "set runtime.plain_tcp: true", "pass --plain-tcp"
        )
        where = {"address": "--dask", "scheduler_file": "--dask", "tls": "--tls", "plain_tcp": "--plain-tcp"}
        field = where.get(str(err["loc"][0]) if err.get("loc") else "", "--dask")
        raise UserError(f"{field}: {msg}") from None


def gpu_groups(devices: list[str], gpus: int, n_workers: int | None) -> list[str]:
    """``local:N --gpus G``: N groups of G devices each (default: as many as fit), as CUDA_VISIBLE_DEVICES."""
    fit = len(devices) // gpus
    if fit == 0:
        raise UserError(f"--gpus {gpus}: {len(devices)} GPU(s) visible here ({','.join(devices) or 'none'})")
    n = fit if n_workers is None else n_workers
    if n > fit:
        raise UserError(
            f"--dask local:{n} --gpus {gpus}: {n} groups of {gpus} GPU(s), but {len(devices)} are visible "
            f"({','.join(devices)}); at most local:{fit}"
        )
    return [",".join(devices[i * gpus : (i + 1) * gpus]) for i in range(n)]


class CampaignSlot(WorkerPlugin):
    """A worker plugin: a worker of a joined cluster started without the :data:`SLOT` resource gets one (workers
    that join later too), so that it runs one of the campaign's runs at a time. A worker started with it
    (``dask worker --resources campaign-slot=1``) keeps its own."""

    name = "rapids-attn-campaign-slot"

    async def setup(self, worker) -> None:
        if SLOT not in worker.state.total_resources:
            await worker.set_resources(**{SLOT: 1})


@contextlib.contextmanager
def campaign_client(target: Target):
    """A client of ``target``'s cluster (started here for ``local``, closed after), and one line that says what it
    is. One-line UserErrors for a cluster that cannot be joined or started."""
    from distributed import Client

    from rapids_attn.runtime import (
        IgnoreSigint,
        check_runtime,
        cluster_security,
        join_scheduler,
        tls_args,
        worker_log_level,
    )

    cfg = runtime_config(target)
    check_runtime(cfg)
    if not target.local:
        client = join_scheduler(cfg)
        try:
            client.register_plugin(CampaignSlot())
            if not client.scheduler_info()["workers"]:
                try:
                    client.wait_for_workers(1, timeout=WAIT_FOR_WORKERS_S)
                except TimeoutError:
                    raise UserError(
                        f"--dask {target.address or target.scheduler_file}: the scheduler has no workers "
                        f"({WAIT_FOR_WORKERS_S} s waited); start them (dask worker / dask cuda worker)"
                    ) from None
            yield client, f"{client.scheduler.address}"
        finally:
            client.close()
        return
    from rapids_attn.processes import environ_kept_of_workers, sigint_blocked

    groups = gpu_groups(visible_gpu_names(), target.gpus, target.n_workers) if target.gpus else None
    n = len(groups) if groups else target.n_workers or default_workers()
    security = cluster_security(cfg)
    kw = {
        "threads_per_worker": 1,
        "processes": target.processes,
        "dashboard_address": "127.0.0.1:0",
        "silence_logs": worker_log_level(),
        "resources": {SLOT: 1},
        **tls_args(security),
    }
    if not target.processes:
        kw["worker_dashboard_address"] = "127.0.0.1:0"
    with contextlib.ExitStack() as stack:
        stack.enter_context(environ_kept_of_workers())
        with sigint_blocked() if target.processes else contextlib.nullcontext():
            if groups:
                cluster = stack.enter_context(GroupCluster(groups, **kw))
            else:
                cluster = stack.enter_context(LocalCluster(n_workers=n, **kw))
        client = stack.enter_context(Client(cluster))
        if target.processes:
            client.register_plugin(IgnoreSigint())
        client.wait_for_workers(n, timeout=WAIT_FOR_WORKERS_S)
        what = f"{n} GPU group(s) of {target.gpus}: {'; '.join(groups)}" if groups else f"{n} worker(s)"
        yield client, f"a local cluster of {what}"


def default_workers() -> int:
    """``local`` without N: one worker per 4 CPUs this process may use, 1 to 8."""
    from rapids_attn.job import available_cpus

    return max(1, min(8, available_cpus() // 4))


class GroupCluster(LocalCluster):
    """A LocalCluster whose worker ``i`` starts with ``CUDA_VISIBLE_DEVICES`` = group ``i`` (dask-cuda's way of
    giving each worker its GPU, with groups of several GPUs). The workers themselves touch no GPU (no CUDA context,
    no RMM pool of their own, unlike dask-cuda's): they start the runs, whose own local-cuda clusters use the
    group."""

    def __init__(self, groups: list[str], **kw):
        super().__init__(n_workers=0, **kw)
        for group in groups:
            spec = {"cls": self.new_spec["cls"], "options": dict(self.new_spec["options"])}
            spec["options"]["env"] = {**(spec["options"].get("env") or {}), "CUDA_VISIBLE_DEVICES": group}
            self.worker_spec[f"gpus-{group}"] = spec
        self.sync(self._correct_state)


# -- on the worker ------------------------------------------------------------------------------------------------


def _nanny_env_keys() -> dict[str, str]:
    """The variables a nanny writes into its worker's environment, with the values it writes."""
    import dask

    return {k: str(v) for k, v in (dask.config.get("distributed.nanny.pre-spawn-environ", default={}) or {}).items()}


def worker_gpu_group(gpus: int) -> str:
    """This worker's GPU group: the first ``gpus`` entries of its CUDA_VISIBLE_DEVICES."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return ",".join(str(i) for i in range(gpus))  # one worker on its host (checked before submitting)
    entries = [v.strip() for v in visible.split(",") if v.strip()]
    if len(entries) < gpus:
        raise UserError(
            f"worker on {socket.gethostname()} sees {len(entries)} GPU(s) (CUDA_VISIBLE_DEVICES={visible}); the "
            f"campaign asks {gpus} per run (--gpus)"
        )
    return ",".join(entries[:gpus])


def _describe_worker(gpus: int) -> dict:
    """Run on each worker before submitting: its host, CPUs and (``gpus``) GPU group."""
    from rapids_attn.job import available_cpus

    info = {"host": socket.gethostname(), "cpus": available_cpus()}
    if gpus:
        try:
            info["group"] = worker_gpu_group(gpus)
            info["set"] = "CUDA_VISIBLE_DEVICES" in os.environ
        except UserError as e:
            info["error"] = str(e)
    return info


def allotment(c_job: Path, r: Run, gpus: int, cpus_share: int, mark: str) -> tuple[dict, list[str]]:
    """The environment and the overrides of ``r`` on this worker (see the module's doc)."""
    nanny = _nanny_env_keys()
    env: dict[str, str | None] = {k: None for k, v in nanny.items() if os.environ.get(k) == v}
    env[MARK] = mark
    sets = []
    set_by_campaign = {o.split("=", 1)[0] for o in r.overrides}
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = worker_gpu_group(gpus)
        wanted = {"runtime.cluster": "local-cuda", "runtime.n_workers": str(gpus)}
    else:
        wanted = {"runtime.cluster": "local", "runtime.n_workers": str(cpus_share), "runtime.threads_per_worker": "1"}
    if "runtime.cluster" not in set_by_campaign:
        sets = [f"{k}={v}" for k, v in wanted.items() if k not in set_by_campaign]
        sets += _unjoin(c_job, r)
    return env, sets


def _unjoin(job: Path, r: Run) -> list[str]:
    """Where the run's job joins a scheduler of its own (``runtime.cluster: scheduler``), the settings that only
    go with that, cleared: the run now starts its cluster inside its worker's share instead."""
    from rapids_attn.errors import JobConfigError
    from rapids_attn.jobfile import load_job

    try:
        rt = load_job(job, list(r.overrides)).runtime
    except JobConfigError:  # the run itself says what is wrong with its job, in its record
        return []
    if rt.cluster != "scheduler":
        return []
    return ["runtime.address=null", "runtime.scheduler_file=null", "runtime.tls=null", "runtime.plain_tcp=false"]


def run_on_worker(c: Campaign, r: Run, force: bool, gpus: int, shares: dict[str, int], mark: str):
    """The Dask task: ``run_task`` of ``r`` with this worker's allotment; (its state, the worker's address)."""
    from distributed import get_worker

    from rapids_attn.campaign import tasks
    from rapids_attn.job import available_cpus

    worker = get_worker()
    share = shares.get(worker.address) or available_cpus()
    env, sets = allotment(c.job, r, gpus, share, mark)
    record = {"worker": worker.address, "worker_name": str(worker.name), "mode": "dask"}
    st = tasks.run_task(c, r, force, env=env, overrides=sets, record=record)
    return st, worker.address


def stop_runs(mark: str) -> int:
    """Run on each worker after Ctrl-C: SIGTERM to this worker's run processes of the campaign ``mark``."""
    import psutil

    stopped = 0
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if p.environ().get(MARK) == mark:
                p.terminate()
                stopped += 1
    return stopped


# -- the campaign process -----------------------------------------------------------------------------------------


def check_workers(client, gpus: int) -> dict[str, int]:
    """Each worker's share of its host's CPUs (by address); with ``gpus``, a one-line UserError where a worker
    has no group of that size, or two workers of one host share a GPU."""
    info = client.run(_describe_worker, gpus)
    per_host = Counter(v["host"] for v in info.values())
    shares = {a: max(1, v["cpus"] // per_host[v["host"]]) for a, v in info.items()}
    if gpus:
        for a, v in info.items():
            if "error" in v:
                raise UserError(f"--gpus {gpus}: worker {a}: {v['error']}")
            if not v["set"] and per_host[v["host"]] > 1:
                raise UserError(
                    f"--gpus {gpus}: worker {a} has no CUDA_VISIBLE_DEVICES and shares {v['host']} with other "
                    "workers: start each with its GPU group (dask cuda worker, or CUDA_VISIBLE_DEVICES=0,1 dask worker)"
                )
        owner: dict[tuple[str, str], str] = {}
        for a, v in sorted(info.items()):
            for dev in v["group"].split(","):
                other = owner.setdefault((v["host"], dev), a)
                if other != a:
                    raise UserError(
                        f"--gpus {gpus}: workers {other} and {a} on {v['host']} would share GPU {dev} (each takes the "
                        "first entries of its CUDA_VISIBLE_DEVICES); dask cuda worker gives one GPU each: use --gpus 1, "
                        "or start each worker with exactly its group visible"
                    )
    return shares


def failed_record(c: Campaign, r: Run, error: str) -> None:
    """The record of a run whose Dask task failed outside its run (a lost worker, a refusal before ``run_task``
    began), written from here so that ``status`` says failed, with why, rather than pending or interrupted."""
    from rapids_attn.campaign.tasks import read_record, write_record

    rec = read_record(c, r) or {}
    write_record(
        c,
        r,
        {
            **rec,
            "index": r.index,
            "label": r.label,
            "run_dir": str(r.run_dir),
            "spec": r.spec_hash,
            "mode": "dask",
            "rc": rec.get("rc") if rec.get("rc") not in (None, 0) else -1,
            "error": rec.get("error") or f"its Dask task failed: {error}",
        },
    )


def run_on_cluster(c: Campaign, indices: list[int] | None, target: Target, force: bool = False, say=print) -> list:
    """The runs ``indices`` (all: None) as Dask tasks on ``target``'s cluster, one per worker at a time; each line
    as it ends (with the worker that ran it); their states in index order."""
    from distributed import as_completed

    from rapids_attn.campaign.tasks import FAILED, TaskState

    runs = c.runs if indices is None else [c.runs[i] for i in indices]
    mark = uuid.uuid4().hex[:12]
    states: dict[int, TaskState] = {}
    with campaign_client(target) as (client, where):
        shares = check_workers(client, target.gpus)
        say(f"dask: {where}; {len(shares)} worker(s), one run each at a time")
        futures = {
            client.submit(
                run_on_worker,
                c,
                r,
                force,
                target.gpus,
                shares,
                mark,
                key=f"campaign-{c.spec.name}-{r.index}-{mark}",
                resources={SLOT: 1},
                pure=False,
                retries=0,
            ): r
            for r in runs
        }
        try:
            for fut in as_completed(futures):
                r = futures[fut]
                try:
                    st, worker = fut.result()
                except Exception as e:  # noqa: BLE001 - a lost worker, a worker-side refusal: this run's failure
                    st, worker = TaskState(r, FAILED, f"{type(e).__name__}: {e}".splitlines()[0][:400]), "?"
                    failed_record(c, r, st.detail)
                states[r.index] = st
                say(
                    f"[{r.index + 1}/{len(c.runs)}] {r.label}: {st.state}{': ' + st.detail if st.detail else ''} "
                    f"(on {worker})"
                )
        except KeyboardInterrupt:
            client.cancel(list(futures))
            with contextlib.suppress(Exception):
                client.run(stop_runs, mark)
            raise
    return [states[r.index] for r in runs]
