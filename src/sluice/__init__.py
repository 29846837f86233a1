"""Sluice: a persistent STOMP message broker."""

__version__ = "0.1.0"
