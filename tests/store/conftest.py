"""Store test fixtures (helpers live in `helpers.py`)."""

from __future__ import annotations

from .helpers import make_journal

__all__ = ["make_journal"]
