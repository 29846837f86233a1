"""The open-files limit of a load-generating process, raised so that many connections fit."""

from __future__ import annotations

import contextlib
import resource

__all__ = ["raise_open_files_limit"]


def raise_open_files_limit() -> int:
    """Raise the RLIMIT_NOFILE soft limit to the hard limit; return the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
