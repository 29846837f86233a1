"""Lists the API answers: filtered, sorted and cut into pages from the query string
(`name`, `sort`, `order`, `offset`, `limit`), each parameter checked (a bad one is a 400)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from sluice.http.errors import ApiError, ErrorCode

__all__ = ["DEFAULT_PAGE", "MAX_PAGE", "Page", "page_of", "query_int"]

DEFAULT_PAGE = 100
MAX_PAGE = 1000

T = TypeVar("T")
Page = dict[str, Any]


def query_int(query: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    """An integer parameter within [low, high]."""
    raw = query.get(name)
    if raw is None:
        return default
    if not raw.isascii() or not raw.isdigit() or not low <= int(raw) <= high:
        raise ApiError(
            ErrorCode.BAD_REQUEST, f"{name} must be an integer from {low} to {high} (got {raw!r})"
        )
    return int(raw)


def page_of(
    items: Sequence[T],
    query: Mapping[str, str],
    *,
    sort_keys: Mapping[str, Callable[[T], Any]],
    default_sort: str,
    render: Callable[[T], dict[str, Any]],
) -> Page:
    """`{"total", "offset", "limit", "items"}`: `items` sorted by the query's `sort` (one of
    `sort_keys`) in its `order` (`asc`, `desc`), from `offset`, at most `limit`."""
    sort = query.get("sort", default_sort)
    key = sort_keys.get(sort)
    if key is None:
        raise ApiError(ErrorCode.BAD_REQUEST, f"sort must be one of {', '.join(sorted(sort_keys))}")
    order = query.get("order", "asc")
    if order not in ("asc", "desc"):
        raise ApiError(ErrorCode.BAD_REQUEST, "order must be asc or desc")
    offset = query_int(query, "offset", 0, 0, 1 << 62)
    limit = query_int(query, "limit", DEFAULT_PAGE, 1, MAX_PAGE)
    ordered = sorted(items, key=key, reverse=order == "desc")
    return {
        "total": len(ordered),
        "offset": offset,
        "limit": limit,
        "items": [render(item) for item in ordered[offset : offset + limit]],
    }
