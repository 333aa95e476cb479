"""Run one step on every host at once; results keyed by host, exceptions kept as values."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, TypeVar

from deploy.errors import Failure

T = TypeVar("T")
R = TypeVar("R")


class HostsFailed(Failure):
    """One step failed on some hosts; the message says what happened where."""

    def __init__(self, step: str, errors: dict[str, BaseException]):
        self.step, self.errors = step, errors
        lines = [f"{step} failed on {len(errors)} host(s):"]
        lines += [f"  - {error}" for error in errors.values()]
        super().__init__("\n".join(lines))


def on_each(items: Iterable[T], key: Callable[[T], str], step: Callable[[T], R],
            ) -> tuple[dict[str, R], dict[str, BaseException]]:
    """Wait for every item, even when some fail, and return (results, errors)."""
    items = list(items)
    results: dict[str, R] = {}
    errors: dict[str, BaseException] = {}
    if not items:
        return results, errors
    with ThreadPoolExecutor(max_workers=min(32, len(items))) as pool:
        futures = {key(item): pool.submit(step, item) for item in items}
        for name, future in futures.items():
            try:
                results[name] = future.result()
            except Exception as exc:  # kept as a value; reported with its host
                errors[name] = exc
    return results, errors


def on_all(step_name: str, items: Iterable[T], key: Callable[[T], str],
           step: Callable[[T], R]) -> dict[str, R]:
    """Like on_each, but raise one HostsFailed naming every failure."""
    results, errors = on_each(items, key, step)
    if errors:
        raise HostsFailed(step_name, errors)
    return results
