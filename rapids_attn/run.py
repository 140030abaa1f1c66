"""``python -m rapids_attn.run job.yaml [--set a.b=value ...] [--stages extract,learn,explain] [--overwrite]``

The only place that exits. Every failure is one line on stderr (``-v`` adds the traceback), except
an internal failure, which keeps its traceback. Exit codes:

- 0: success.
- 1: an internal failure (a bug): its traceback.
- 2: a problem with the job, its inputs or its environment, in one line that names the field, file,
  line or path and the fix. Errors raised on a worker (a model whose weights do not load) arrive
  re-raised here with their own type and are reported the same way; the workers' own log of the
  failed task is quiet unless ``-v`` (:mod:`rapids_attn.runtime`). A full disk or quota (ENOSPC,
  EDQUOT) anywhere in the run, in this process or on a worker, is this kind of error too:
  ``error: no space left on device writing <path>; free space and rerun the same command to resume
  (finished shards are kept)``; nothing half-written is taken for finished (a shard counts only once
  its done-marker is written, after its rows).
- 130: interrupted (Ctrl-C, SIGINT); 143: terminated (SIGTERM, 128 + 15 as a shell reports it).
  Either way the run unwinds the same way: the cluster is closed (its workers ignore SIGINT, so
  Ctrl-C in a terminal interrupts this process only), finished shards are kept, and one line says
  that rerunning the same command resumes.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
import warnings

from rapids_attn.errors import UserError

#: errno values that mean "the disk (or the user's quota) is full"
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)

INTERRUPTED = "interrupted: finished shards are kept; rerun the same command to resume"
TERMINATED = "terminated (SIGTERM): finished shards are kept; rerun the same command to resume"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread where Ctrl-C raises KeyboardInterrupt, so that a terminated run
    unwinds exactly like an interrupted one (the cluster closed, finished shards kept)."""


def build_parser() -> argparse.ArgumentParser:
    from rapids_attn.registry import stages_help

    p = argparse.ArgumentParser(
        prog="python -m rapids_attn.run",
        description="Run a rapids_attn job: extract attention maps, embed, store in Zarr, reduce and cluster them, "
        "score heads, trace relevance, and explain the clusters in a report.",
    )
    p.add_argument("job", help="the job's YAML file (see jobs/ for examples)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a job field, e.g. --set data.limit=100 (repeatable; values parsed as YAML)",
    )
    p.add_argument(
        "--stages",
        default=None,
        help=stages_help(),  # from the registry: its stages in run order, and which a job turns on
    )
    p.add_argument("--overwrite", action="store_true", help="replace a store made by a different job")
    p.add_argument("--check", action="store_true", help="validate the job and its inputs, then stop")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    return p


def configure_process(verbose: bool) -> None:
    """Process-wide settings, made here and nowhere else (library code leaves the process as it found it).

    - OpenMP threads that spin-wait make scikit-learn's KMeans 30x slower whenever the cores are
      shared (Dask workers, other jobs): passive waiting avoids it. Set before sklearn/torch load
      libgomp; an explicit OMP_WAIT_POLICY in the environment wins (docs/benchmarks.md).
    - Hugging Face progress bars (one per worker per model load) are noise next to the job's own
      progress bar; the variable also reaches the worker processes the job starts.
    - Other libraries' Python warnings (a deprecation, a solver's convergence note) are not the user's
      to act on and are hidden unless -v, here and in the workers (``PYTHONWARNINGS``); everything the job
      itself has to say is its own "warning:" lines.
    - Logging: warnings only, and distributed's, bokeh's and tornado's loggers quiet unless -v:
      distributed's errors too (a failed task, a worker lost to a signal), since every failure that
      reaches the job is reported in its one line; a local cluster's workers follow (runtime.py).
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not verbose:  # other libraries' warnings (deprecations, a solver's convergence notes): -v shows them
        warnings.filterwarnings("ignore")
        os.environ.setdefault("PYTHONWARNINGS", "ignore")  # the workers this job starts inherit it
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    if not verbose:
        import distributed  # noqa: F401  (it sets its loggers' levels on import; quiet them after)

        logging.getLogger("distributed").setLevel(logging.CRITICAL)
        for name in ("bokeh", "tornado"):
            logging.getLogger(name).setLevel(logging.ERROR)


@contextlib.contextmanager
def sigterm_as_interrupt():
    """Inside, the first SIGTERM raises :class:`Terminated` in the main thread; a repeated one (a process
    manager's reminder) is ignored while the run closes. The previous handler is restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated()

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def disk_full(exc: BaseException) -> OSError | None:
    """The OSError meaning a full disk or quota in ``exc``, its causes and contexts, or an exception
    group's members (a library may wrap it); None if there is none."""
    todo, seen = [exc], set()
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in DISK_FULL:
            return e
        todo.extend([e.__cause__, e.__context__, *getattr(e, "exceptions", ())])
    return None


#: an output the job cannot write where it must: a directory, or no permission, in the way of a file
UNWRITABLE = {errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENOTDIR, errno.EROFS}


def unwritable(exc: BaseException) -> OSError | None:
    """The OSError in ``exc`` (or what it was raised from) that names a path the job could not write; None if
    there is none."""
    e = exc
    while e is not None:
        if isinstance(e, OSError) and e.errno in UNWRITABLE and e.filename:
            return e
        e = e.__cause__ or e.__context__
    return None


def fail(message: str, code: int, verbose: bool) -> int:
    """Report a failure: the traceback first with -v, then the one line; the workers' fork server, if this run
    started one, is ended (:func:`end_worker_server`)."""
    from rapids_attn.job import one_line

    end_worker_server()
    if verbose:
        traceback.print_exc()
    print(one_line(message), file=sys.stderr, flush=True)  # one line of at most 1,000 characters, whatever it quotes
    return code


def end_worker_server() -> None:
    """A job that ends early ends the fork server it started (:func:`_start_server_early`): one still importing
    torch would hold the job's output streams open for seconds after its exit."""
    processes = sys.modules.get("rapids_attn.processes")  # not imported: no server was started
    if processes is not None:
        processes.stop_worker_server()


def overrides_in_order(argv: list[str]) -> list[str]:
    """The KEY=VALUE words of every ``--set`` (``--set a=1 b=2`` included) in the order they were typed: a later
    one wins, as the help says."""
    out: list[str] = []
    taking = False
    for x in argv:
        if x == "--set":
            taking = True
        elif x.startswith("--set="):
            out.append(x[len("--set=") :])
            taking = True
        elif taking and "=" in x and not x.startswith("-"):
            out.append(x)
        else:
            taking = False
    return out


def _start_server_early(cfg, stages: str | None) -> None:
    """The local workers' fork server, started as soon as the job is read (before the pipeline's own imports,
    1.5 s of torch), when a stage this run may run uses workers (``stages``: the ``--stages`` value, or None for
    the default run, which has extract): its imports are what starting the workers waits for (``run_job`` starts
    it too, a no-op once it runs)."""
    from rapids_attn.processes import start_worker_server
    from rapids_attn.registry import worker_modules, worker_stages

    named = None if stages is None else {s.strip() for s in stages.split(",")}
    if named is None or worker_stages() & named:
        start_worker_server(cfg.runtime, worker_modules())


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # allow "--set a=1 b=2": trailing KEY=VALUE words after --set
    stray = [x for x in extra if "=" in x and not x.startswith("-")]
    unknown = [x for x in extra if x not in stray]
    if unknown:
        print(f"error: unknown argument {unknown[0]}; see --help", file=sys.stderr)
        return 2
    ordered = overrides_in_order(sys.argv[1:] if argv is None else list(argv))
    # argparse's own reading when the words differ (an abbreviated --se, say): the same words, its order
    overrides = ordered if sorted(ordered) == sorted(args.overrides + stray) else args.overrides + stray
    configure_process(args.verbose)
    cfg = None
    try:
        with sigterm_as_interrupt():
            from rapids_attn.jobfile import load_job

            cfg = load_job(args.job, overrides)
            from rapids_attn.processes import turned_off

            turned_off()  # a name in RAPIDS_ATTN_WITHOUT that is no piece: one line, exit 2
            if not args.check:
                _start_server_early(cfg, args.stages)
            from rapids_attn.pipeline import preflight, run_job  # torch and the stages: 1.5 s
            from rapids_attn.registry import parse_stages

            stages = parse_stages(args.stages, cfg)
            if args.check:
                ctx = preflight(cfg, stages, args.overwrite).ctx
                print(
                    f"ok: {len(ctx.data)} examples, {len(ctx.layout.layers)} layers x {len(ctx.layout.heads)} "
                    f"heads, {ctx.layout.n_shards} shards, feature dim {ctx.layout.feature_dim} -> {ctx.run_dir}"
                )
                return 0
            t0 = time.perf_counter()
            summary = run_job(cfg, stages, overwrite=args.overwrite)
    except UserError as e:
        return fail(f"error: {e}", e.exit_code, args.verbose)
    except KeyboardInterrupt as e:
        if isinstance(e, Terminated):
            return fail(TERMINATED, 143, args.verbose)
        return fail(INTERRUPTED, 130, args.verbose)
    except Exception as e:
        full = disk_full(e)
        blocked = unwritable(e) if full is None else None
        if blocked is not None:
            where = os.fsdecode(blocked.filename)
            if not os.path.isabs(where) and cfg is not None:  # a library's path, relative to its store
                where = f"{where} under {cfg.run_dir}"
            return fail(
                f"error: cannot write {where}: {blocked.strerror}; move it out of the way or fix its "
                "permissions, and rerun the same command to resume (finished stages are kept)",
                2,
                args.verbose,
            )
        if full is None:
            end_worker_server()
            raise  # an internal failure: its traceback, exit 1
        where = full.filename or (cfg.run_dir if cfg is not None else "the run directory")
        return fail(
            f"error: no space left on device writing {where}; free space and rerun the same command to resume "
            "(finished shards are kept)",
            2,
            args.verbose,
        )
    counts = summary.get("counts")
    took = time.perf_counter() - t0
    if counts:
        clusters = summary["clusters"]
        sil = clusters.get("silhouette")
        print(
            f"done in {took:.1f}s: {counts['examples']} examples, {counts['maps']:,} maps, "
            f"{clusters['n_clusters']} clusters ({clusters['method']}, silhouette "
            f"{'n/a' if sil is None else f'{sil:.3f}'}), {counts['truncated_examples']} truncated"
        )
        names = ["maps.parquet", "summary.json", "store.zarr"]
        if summary.get("head_classes"):
            names.insert(2, "head_classes.json")
        print("outputs: " + ", ".join(f"{cfg.run_dir}/{n}" for n in names))
        if summary.get("report"):
            print(f"report:  {cfg.run_dir / summary['report']}  (open it in a browser; no server needed)")
    else:
        print(f"done in {took:.1f}s: stages {','.join(stages)}")
        print(json.dumps({k: v for k, v in summary.items() if k != "stages"}, default=str)[:2000])
    return 0


if __name__ == "__main__":
    import atexit

    _status: dict = {}
    from rapids_attn.processes import exit_without_teardown

    atexit.register(exit_without_teardown, _status)  # first registered: it runs last
    _status["code"] = main()
    sys.exit(_status["code"])
