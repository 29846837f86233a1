"""Selectors' public face: `compile_selector` and the compiled `Selector`, with their limits.

`compile_selector` runs the text through the lexer, the parser and code generation once; the
`Selector` it returns is kept by the subscription and matched against each message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from sluice.core.selector.errors import SelectorError
from sluice.core.selector.evaluate import (
    PropertyLookup,
    _Fn,
    _fold,
    _generate_condition,
    _identifiers,
)
from sluice.core.selector.lexer import _Tok, _tokenize
from sluice.core.selector.parser import _Parser

MAX_SELECTOR_LENGTH: Final = 4096
"""Default bound on the selector text, in characters."""

JMS_HEADER_IDENTIFIERS: Final = frozenset(
    {
        "JMSDeliveryMode",
        "JMSPriority",
        "JMSMessageID",
        "JMSTimestamp",
        "JMSCorrelationID",
        "JMSType",
        "JMSRedelivered",
        "JMSDestination",
        "JMSReplyTo",
        "JMSExpiration",
        "JMSXGroupID",
        "JMSXGroupSeq",
        "JMSXDeliveryCount",
    }
)
"""Identifiers the caller should supply (through `extra`) from the message's own fields."""


class Selector:
    """A compiled selector. `matches` is cheap and never raises; build one per subscription.

    `text` is the selector as given; `identifiers` holds every property or header name it reads
    (a caller can skip building JMS header fields the selector never names).
    """

    __slots__ = ("_evaluate", "identifiers", "text")

    def __init__(self, text: str, evaluate: _Fn, identifiers: frozenset[str]) -> None:
        self.text = text
        self.identifiers = identifiers
        self._evaluate = evaluate

    def matches(self, lookup: PropertyLookup) -> bool:
        """True when the selector is TRUE for the message whose properties `lookup` returns."""
        return self._evaluate(lookup) is True

    def matches_headers(
        self, headers: Mapping[str, str], extra: Mapping[str, object] | None = None
    ) -> bool:
        """Match against STOMP headers (strings), with `extra` (e.g. JMS header fields) first."""
        if extra is None:
            return self._evaluate(headers.get) is True
        extra_get, headers_get = extra.get, headers.get

        def lookup(name: str) -> object:
            v = extra_get(name)
            return headers_get(name) if v is None else v

        return self._evaluate(lookup) is True

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


def compile_selector(text: str, *, max_length: int = MAX_SELECTOR_LENGTH) -> Selector:
    """Parse and compile a selector; raise `SelectorError` for bad syntax, types or size."""
    if len(text) > max_length:
        raise SelectorError(f"longer than max_length={max_length} characters ({len(text)})")
    tokens = _tokenize(text)
    if tokens[0].kind is _Tok.END:
        raise SelectorError("empty selector")
    tree = _Parser(tokens).parse()
    identifiers = frozenset(_identifiers(tree))
    tree = _fold(tree)
    return Selector(text, _generate_condition(tree), identifiers)
