"""The broker model: destinations, subscriptions, dispatch, credit; knows nothing of STOMP."""
