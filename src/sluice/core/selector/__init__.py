"""JMS message selectors: compile the SQL-92 subset of JMS 1.1/2.0 once, evaluate it per message.

Clients pass a selector in the SUBSCRIBE header `selector`; a subscription only receives messages
for which it is TRUE. `compile_selector` parses the text into a tree of small closures;
`Selector.matches` runs them against a property lookup and never raises, whatever the values.

The modules, in the order text flows through them: `lexer` turns text into tokens, `parser`
builds the syntax tree (the grammar, the type checks on literals, the depth limit), `like` compiles
LIKE patterns, `evaluate` holds the value rules and three-valued logic and turns the tree into
closures, and `compiler` ties them together behind `compile_selector` and `Selector`.
"""

from __future__ import annotations

from sluice.core.selector.compiler import (
    JMS_HEADER_IDENTIFIERS,
    MAX_SELECTOR_LENGTH,
    Selector,
    compile_selector,
)
from sluice.core.selector.errors import SelectorError
from sluice.core.selector.evaluate import PropertyLookup
from sluice.core.selector.parser import MAX_SELECTOR_DEPTH

__all__ = [
    "JMS_HEADER_IDENTIFIERS",
    "MAX_SELECTOR_DEPTH",
    "MAX_SELECTOR_LENGTH",
    "PropertyLookup",
    "Selector",
    "SelectorError",
    "compile_selector",
]
