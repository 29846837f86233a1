"""Tests of the broker core (sluice.core)."""
