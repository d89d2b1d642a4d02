"""setuptools hook (the metadata is in pyproject.toml): a wheel carries the run-config
defaults, pyproject.toml's ``[tool.flwr.app.config]``, as package data of
``fedinit.config``, since an installed wheel has no checkout to read them from."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PYPROJECT = Path(__file__).resolve().parent / "pyproject.toml"


class BuildPyWithDefaults(build_py):
    """build_py, plus the copy of pyproject.toml that ``fedinit/config/defaults.py`` reads."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "fedinit" / "config" / "pyproject.toml"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(PYPROJECT.read_bytes())


setup(cmdclass={"build_py": BuildPyWithDefaults})
