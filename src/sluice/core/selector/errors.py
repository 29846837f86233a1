"""The one error a selector raises when it is compiled; evaluation never raises."""

from __future__ import annotations

from sluice.errors import SluiceError


class SelectorError(SluiceError):
    """A selector is malformed or too large. `position` is the character offset, when known."""

    def __init__(self, reason: str, position: int | None = None) -> None:
        self.reason = reason
        self.position = position
        where = f" at position {position}" if position is not None else ""
        super().__init__(f"selector: {reason}{where}")
