"""The controller's client of the hosts: one agent per host on its transport (hostagent.py),
asked each step of a run on every host at once (session.py, parallel.py)."""
