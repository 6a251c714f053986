"""The dict reads of earlier releases on the dataclasses that replaced their
dicts (Event, AgentStats, Command): obj["key"], "key" in obj, obj.get(key)
and obj.keys() still work, each with a DeprecationWarning naming the
attribute to read instead."""

from __future__ import annotations

import dataclasses as _dataclasses
import warnings as _warnings
from typing import Any

__all__ = ["KeyAccess"]


class KeyAccess:
    """Mixed into a dataclass: its fields read as the keys of the dict it
    replaced. Deprecated; read the attributes."""

    __slots__ = ()

    def _keys(self) -> tuple[str, ...]:
        return tuple(f.name for f in _dataclasses.fields(self))  # type: ignore[arg-type]

    def _deprecated(self, what: str, instead: str) -> None:
        _warnings.warn(f"trainwatch: reading {type(self).__name__} as a dict ({what}) is "
                       f"deprecated: read {instead}", DeprecationWarning, stacklevel=3)

    def __getitem__(self, key: str) -> Any:
        if key not in self._keys():
            raise KeyError(key)
        self._deprecated(f"[{key!r}]", f".{key}")
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        self._deprecated(f"{key!r} in", "the attributes")
        return key in self._keys()

    def get(self, key: str, default: Any = None) -> Any:
        self._deprecated(f".get({key!r})", f".{key}")
        return getattr(self, key) if key in self._keys() else default

    def keys(self) -> list[str]:
        self._deprecated(".keys()", "the attributes (dataclasses.fields() lists them)")
        return list(self._keys())
