"""Imported last by the local workers' fork server (:func:`rapids_attn.processes.worker_modules`), after the
modules its workers need: the piece ``server-freeze`` of :mod:`rapids_attn.processes`, which says what it saves.

It collects what the imports left and freezes the rest (``gc.freeze``), as Python's documentation advises
for a process that forks without exec: a worker forked from the server never walks the imported modules'
objects in its garbage collections, nor copies their pages by touching them.

And the server ends without the interpreter's teardown: it holds the job's stdout and stderr until it
exits, so ``python -m rapids_attn.run job.yaml | tee log`` waits for it, and tearing down torch and
transformers took about a second (with the objects frozen, nanobind, triton's bindings, would also report
them as leaked). The server runs no code of its own at exit: it starts no processes of its own (its forks
are the workers, which leave with ``os._exit`` and never run this) and writes nothing.
"""

import atexit
import gc
import os
import sys


def _exit_now() -> None:
    """The server's first handler at exit (the last registered): flush and leave."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(0)


gc.collect()
gc.freeze()
atexit.register(_exit_now)
