"""Per-head means with bootstrap 95% intervals over examples, for the comparison's measures (issue 37)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class HeadIntervals:
    """A measure's mean over examples for each layer and head, and its bootstrap interval ([layers, heads] each)."""

    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    n_examples: int
    level: float

    def ranked(self) -> list[tuple[int, int]]:
        """(layer, head) from the largest mean to the smallest (ties in layer, head order)."""
        flat = self.mean.ravel()
        order = np.lexsort((np.arange(flat.size), -flat))
        return [divmod(int(i), self.mean.shape[1]) for i in order]

    def excludes(self, value: float = 0.0) -> np.ndarray:
        """[layers, heads]: whether the interval lies wholly on one side of ``value``."""
        return (self.low > value) | (self.high < value)


def head_intervals(values: np.ndarray, level: float = 0.95, n_resamples: int = 1000, seed: int = 0) -> HeadIntervals:
    """``values`` [examples, layers, heads] (one measure per example) -> each head's mean over the examples and
    the percentile bootstrap interval of that mean (scipy.stats.bootstrap, resampling examples, ``seed``d). A
    head whose every value is the same has that value as its mean and both ends, exactly."""
    import inspect

    from scipy.stats import bootstrap

    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 3 or x.shape[0] == 0:
        raise ValueError(f"values must be [examples, layers, heads] with at least one example, got {x.shape}")
    n, layers, heads = x.shape
    flat = x.reshape(n, -1)
    mean = flat.mean(0)
    low, high = mean.copy(), mean.copy()
    varies = np.ptp(flat, axis=0) > 0  # a constant column's interval is its value (the bootstrap would warn)
    if n > 1 and varies.any():
        res = bootstrap(
            (flat[:, varies],),
            np.mean,
            axis=0,
            vectorized=True,
            n_resamples=n_resamples,
            confidence_level=level,
            method="percentile",
            # scipy 1.15 named it rng; the project allows scipy 1.11, where it is random_state
            **{
                ("rng" if "rng" in inspect.signature(bootstrap).parameters else "random_state"): np.random.default_rng(
                    seed
                )
            },
        )
        low[varies], high[varies] = res.confidence_interval.low, res.confidence_interval.high
    shape = (layers, heads)
    return HeadIntervals(mean.reshape(shape), low.reshape(shape), high.reshape(shape), n, level)
