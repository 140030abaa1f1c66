"""Imported last by the local workers' fork server (:data:`rapids_attn.runtime.WORKER_MODULES`), after the
modules its workers need: it collects what the imports left and freezes the rest (``gc.freeze``), as
Python's documentation advises for a process that forks without exec. A worker forked from the server then
never walks the imported modules' objects in its garbage collections (nor copies their pages by touching
them), and the server's own exit, when the job ends, skips collecting them: about a second with torch and
transformers imported, during which the server still holds the job's stdout and stderr open."""

import gc

gc.collect()
gc.freeze()
