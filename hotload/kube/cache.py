"""The one cache: an in-memory view of a set of objects, fed by watch events and
re-seeded by lists (:class:`hotload.kube.reflector.Reflector` feeds it).

A watch tells what changed, not what disappeared while it was down (kopf re-lists after
a pause without saying). So a consumer seeds its view with every LIST (at start, after
an expired version or an outage, and now and then) and keeps it current from events in
between. Events and a list in flight race; the newer version
of each object wins, where "newer" compares ``resourceVersion`` as etcd's revision
numbers (what every apiserver returns, though the API calls them opaque; a value that
is not a number is taken as newer, so the last writer wins), and a deletion seen in an
event is remembered until the next list, so a list taken before it cannot resurrect
the object.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

V = TypeVar("V")


def _revision(version: str) -> int | None:
    try:
        return int(version)
    except ValueError:
        return None


def is_newer(candidate: str, existing: str) -> bool:
    """True when version ``candidate`` is not older than ``existing``."""
    new, old = _revision(candidate), _revision(existing)
    if new is None or old is None:
        return True
    return new >= old


@dataclass(frozen=True)
class Versioned(Generic[V]):
    uid: str
    resource_version: str
    value: V


class VersionedStore(Generic[V]):
    """Objects by name; each update keeps the newer version (see module docstring)."""

    def __init__(self) -> None:
        self._items: dict[str, Versioned[V]] = {}
        self._deleted: dict[str, str] = {}
        """name → resourceVersion of a deletion seen since the last list."""

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def get(self, name: str) -> V | None:
        item = self._items.get(name)
        return item.value if item else None

    def resource_version(self, name: str) -> str | None:
        """The version of the object we hold (what a write planned from it is conditioned on)."""
        item = self._items.get(name)
        return item.resource_version if item else None

    def holds(self, name: str, resource_version: str) -> bool:
        """True when this exact version of the object is what we hold (nothing to parse)."""
        item = self._items.get(name)
        return item is not None and item.resource_version == resource_version

    def values(self) -> list[V]:
        return [item.value for item in self._items.values()]

    def items(self) -> list[tuple[str, V]]:
        return [(name, item.value) for name, item in self._items.items()]

    def upsert(self, name: str, uid: str, resource_version: str, value: V) -> bool:
        """Record an object seen in an event; False when it was older than what we hold."""
        current = self._items.get(name)
        if current is not None and (
            current.resource_version == resource_version
            or not is_newer(resource_version, current.resource_version)
        ):
            return False
        tombstone = self._deleted.get(name)
        if tombstone is not None and not is_newer(resource_version, tombstone):
            return False
        self._items[name] = Versioned(uid, resource_version, value)
        return True

    def delete(self, name: str, uid: str, resource_version: str) -> bool:
        """Record a deletion seen in an event; False when we already hold a newer object."""
        current = self._items.get(name)
        self._deleted[name] = resource_version
        if current is None:
            return False
        if current.uid != uid and not is_newer(resource_version, current.resource_version):
            return False  # a newer object of the same name replaced the deleted one
        del self._items[name]
        return True

    def reseed(self, listed: Mapping[str, Versioned[V]], list_version: str) -> None:
        """Merge a full LIST taken at ``list_version``: what it lacks and is older is gone."""
        for name in list(self._items):
            if name not in listed and is_newer(list_version, self._items[name].resource_version):
                del self._items[name]
        for name, item in listed.items():
            self.upsert(name, item.uid, item.resource_version, item.value)
        self._deleted.clear()
