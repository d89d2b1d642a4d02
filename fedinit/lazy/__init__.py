"""Names and registries that import their module on first use, so a process loads what its
half needs (issue 43: ``from strategies import FedInit`` loads at most 45 of the project's
modules). Imports nothing of the project: any layer may use it."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def names_on_first_use(package: str, home: Mapping[str, str]) -> Callable[[str], Any]:
    """A package's module ``__getattr__`` (PEP 562): each name of ``home`` (name -> the
    module of ``package`` that holds it) is imported from there when first read."""

    def __getattr__(name: str) -> Any:
        if name in home:
            return getattr(importlib.import_module(f"{package}.{home[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


class SpecRegistry(Mapping[str, T], Generic[T]):
    """Specs by name, each read from its module's ``SPEC`` when looked up (the module
    imported then; a test that replaces a module's ``SPEC`` is seen at once). Iterating
    the values loads every module."""

    def __init__(self, package: str, homes: Mapping[str, str], kind: type[T]) -> None:
        self.package, self.homes, self.kind = package, homes, kind

    def __getitem__(self, name: str) -> T:
        if name not in self.homes:
            raise KeyError(name)
        spec = importlib.import_module(f"{self.package}.{self.homes[name]}").SPEC
        assert isinstance(spec, self.kind) and getattr(spec, "name", name) == name, (name, spec)
        return spec

    def __iter__(self) -> Iterator[str]:
        return iter(self.homes)

    def __len__(self) -> int:
        return len(self.homes)


__all__ = ["SpecRegistry", "names_on_first_use"]
