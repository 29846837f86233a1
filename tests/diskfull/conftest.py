"""The `small_fs` fixture (see `helpers.py`)."""

from diskfull.helpers import small_fs

__all__ = ["small_fs"]
