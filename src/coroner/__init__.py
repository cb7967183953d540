"""Coroner: a registry of worker processes kept honest (README.md)."""

#: The release's version, written here and nowhere else by hand. pyproject.toml reads it (setuptools'
#: dynamic version), the code derives the image references and the injection's version from it, and
#: every file that must spell it (the manifests' and the chart's image pins, Chart.yaml, the krew
#: manifest, the docs' examples) is held equal to it by `python -m coroner_dev.release check`
#: (tests/unit/test_version.py).
__version__ = "0.1.0"
