"""The launch-plan cache every op uses: what a call shape needs to launch, kept by that call shape.

An op validates its operands, chooses a kernel, a grid and the scalar arguments once per call shape
(shapes, strides, dtypes, devices and options: the *key*); a repeated call with the same key looks the
*plan* up and only reads the addresses and launches. Each op family owns one :class:`PlanCache`;
all of them are registered here, so :func:`clear_plan_caches` empties every one (a device reset,
tests) and :func:`plan_cache_stats` lists their sizes.

A cache is bounded: when full, the oldest entry is dropped (insertion order), so a workload that
cycles through more call shapes than the bound degrades to validating again, never to unbounded
memory. Lookups take no lock: a dict read is atomic in CPython, and two threads racing to insert the
same key insert equal plans.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["DEFAULT_PLAN_CACHE_SIZE", "PlanCache", "clear_plan_caches", "plan_cache_stats"]

DEFAULT_PLAN_CACHE_SIZE = 4096

V = TypeVar("V")

_registry: weakref.WeakSet[PlanCache[object]] = weakref.WeakSet()
_registry_lock = threading.Lock()


class PlanCache(Generic[V]):
    """A bounded map from call-shape keys to launch plans, for one op family.

    ``get(key)`` returns the plan or None (one dict lookup: the hot path of every repeated call);
    ``put(key, plan)`` stores it, dropping the oldest entry when the cache holds ``maxsize``.
    """

    __slots__ = ("__weakref__", "_lock", "_plans", "maxsize", "name")

    def __init__(self, name: str, maxsize: int = DEFAULT_PLAN_CACHE_SIZE) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("PlanCache needs a non-empty name")
        if not isinstance(maxsize, int) or isinstance(maxsize, bool) or maxsize < 1:
            raise ValueError(f"PlanCache {name!r}: maxsize must be a positive int, got {maxsize!r}")
        self.name = name
        self.maxsize = maxsize
        self._plans: dict[Hashable, V] = {}
        self._lock = threading.Lock()
        with _registry_lock:
            _registry.add(self)  # type: ignore[arg-type]

    def get(self, key: Hashable) -> V | None:
        return self._plans.get(key)

    def put(self, key: Hashable, plan: V) -> V:
        """Store ``plan`` under ``key`` and return it."""
        with self._lock:
            plans = self._plans
            if key not in plans and len(plans) >= self.maxsize:
                del plans[next(iter(plans))]
            plans[key] = plan
        return plan

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)

    def __contains__(self, key: object) -> bool:
        return key in self._plans

    def __repr__(self) -> str:
        return f"PlanCache({self.name!r}, {len(self._plans)}/{self.maxsize})"


def clear_plan_caches() -> None:
    """Empty every registered plan cache (after a device reset, or to measure first-call costs)."""
    with _registry_lock:
        caches = list(_registry)
    for cache in caches:
        cache.clear()


def plan_cache_stats() -> dict[str, tuple[int, int]]:
    """``{name: (entries, maxsize)}`` for every registered cache (names may repeat per package)."""
    with _registry_lock:
        caches = sorted(_registry, key=lambda c: c.name)
    return {cache.name: (len(cache), cache.maxsize) for cache in caches}
