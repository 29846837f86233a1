"""asyncio listeners and the session that bridges STOMP events to core calls."""
