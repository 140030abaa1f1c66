"""The consumer tier runs in its own venv (tests/consumers/run.sh, --confcutdir keeps tests/conftest.py out): the
project is imported from this checkout through PYTHONPATH, never installed there."""
