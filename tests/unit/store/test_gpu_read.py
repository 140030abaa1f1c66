"""The GPU learn backend reads the store with zarr's GPU buffers for that one read (issue 35): zarr's configuration is
process-wide, so switching it (``zarr.config.enable_gpu()``) for a read gave GPU buffers to every zarr call of the
process while it held, a shard's write or another thread's CPU read among them. Without CuPy the GPU buffers cannot
be built: the read is stood in for, and what it was handed and what zarr's configuration said are checked."""

from __future__ import annotations

import threading

import numpy as np
import zarr

from rapids_attn.backends.learn import LearnBackend


def test_the_gpu_read_leaves_zarrs_configuration_alone(tmp_path, monkeypatch):
    from zarr.core.buffer.gpu import buffer_prototype

    arr = zarr.create_array(str(tmp_path / "f.zarr"), shape=(8, 3), chunks=(4, 3), dtype="float16")
    arr[:] = np.arange(24, dtype=np.float16).reshape(8, 3)
    before = (zarr.config.get("buffer"), zarr.config.get("ndbuffer"))
    assert before[0].endswith("cpu.Buffer")
    during, others = [], []
    real = zarr.Array.get_basic_selection

    def get(self, selection=Ellipsis, *, prototype=None, **kw):
        during.append((zarr.config.get("buffer"), zarr.config.get("ndbuffer"), prototype))
        # another thread reading the store meanwhile (a CPU stage, a shard's write) gets host buffers
        t = threading.Thread(target=lambda: others.append(type(real(self, selection))))
        t.start()
        t.join()
        return real(self, selection, **kw)  # the host copy, standing in for the GPU buffers CuPy would give

    monkeypatch.setattr(zarr.Array, "get_basic_selection", get)
    gpu = LearnBackend("cuml", "test", xp=np)  # the GPU backend's code path, numpy standing in for CuPy
    got = gpu.read(arr, slice(2, 6))
    assert got.dtype == np.float32 and np.array_equal(got, np.arange(6, 18, dtype=np.float32).reshape(4, 3))
    assert during == [(*before, buffer_prototype)]  # GPU buffers handed to this read, the configuration unchanged
    assert others == [np.ndarray]
    assert (zarr.config.get("buffer"), zarr.config.get("ndbuffer")) == before
