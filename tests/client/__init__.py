"""Tests of the Sluice client against a scripted STOMP server."""
