"""Maintainers' tools, run from the repository root and never installed with the package."""
