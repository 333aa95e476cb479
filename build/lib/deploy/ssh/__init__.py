"""Reaching hosts: one transport interface (SSH or local processes), logins and host keys,
steps run on every host in parallel (parallel.py, session.py)."""
