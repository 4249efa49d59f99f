"""raypack's version: the package's (pyproject reads it from here), the manifest's raypack_version."""

__version__ = "0.1.0"
