"""Driving runs end to end: checks, setup, launch, following, restarts, teardown and the
commands that find a run again."""
