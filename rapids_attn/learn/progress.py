"""The learn stage's progress on stderr: one ``rapids_attn: learn: ...`` line per step of the fit.

The fit's modules (:mod:`~rapids_attn.learn.estimator`, :mod:`~rapids_attn.learn.fit`,
:mod:`~rapids_attn.learn.spread`) log each step once, at INFO, on their loggers under ``rapids_attn.learn``:
reading the sample, PCA, UMAP, the k sweep, the clusterer, the stability refits, the assignment and writing, and a
last line with the clusters and the time (about six lines a run, the same on a terminal and in a log file). Library
code prints nothing itself: :func:`stage_lines` shows those lines while the learn stage runs, and a user of
:class:`~rapids_attn.learn.MapClusterer` sees them through :mod:`logging` when asked for.
"""

from __future__ import annotations

import contextlib
import logging
import sys

#: the logger above the fit's modules'
LOGGER = "rapids_attn.learn"


class _StageFormat(logging.Formatter):
    """INFO records as the stage's status lines; a warning or worse as the job's ``warning:`` lines."""

    def format(self, record: logging.LogRecord) -> str:
        prefix = "rapids_attn: learn: " if record.levelno < logging.WARNING else "warning: "
        return prefix + record.getMessage()


@contextlib.contextmanager
def stage_lines(stream=None):
    """While it holds, the fit's INFO lines (and warnings) go to ``stream`` (stderr), each flushed as it comes, and
    only there: not also to the root logger's handlers (``-v``'s, which would print each line twice). The logger's
    level, handlers and propagation are as they were afterwards."""
    logger = logging.getLogger(LOGGER)
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(_StageFormat())
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
