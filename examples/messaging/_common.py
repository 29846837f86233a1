"""Where the examples find the broker: SLUICE_BROKER, or the default address."""

import os

BROKER = os.environ.get("SLUICE_BROKER", "127.0.0.1:61613")
