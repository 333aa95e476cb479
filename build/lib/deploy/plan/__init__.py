"""Planning: pure functions from an inventory and options to the exact commands, stdin and
environment every host will get; no network, no clock, no randomness."""
