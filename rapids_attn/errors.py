"""Error types. User errors (exit 2) derive from UserError; anything else is an internal failure (exit 1).

Every user error carries one line that names the field, file or line at fault and says how to fix it.
"""


class RapidsAttnError(Exception):
    """Base class for every error this package raises on purpose."""


class UserError(RapidsAttnError):
    """A problem with the job or its inputs: reported as one line, exit code 2, no traceback."""

    exit_code = 2


class JobConfigError(UserError):
    """The job file or a --set override is invalid."""


class DataError(UserError):
    """A dataset file is missing, malformed, or lacks a field the job names."""


class ModelError(UserError):
    """The model cannot be resolved or loaded, or does not expose attention maps."""


class BackendUnavailableError(UserError):
    """The job asks for a device or library (CUDA, cuML, dask-cuda) that this machine lacks."""


class StoreError(UserError):
    """The run directory holds a store from a different job, or one that cannot be reused."""
