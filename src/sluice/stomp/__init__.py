"""Sans-IO STOMP 1.0/1.1/1.2: bytes in, events out; no sockets, no clock, no logging."""
