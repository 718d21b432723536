"""The package's version, in a module of its own: servers that report it import this, not
the package root (which re-exports the public API)."""

__version__ = "0.1.0"
