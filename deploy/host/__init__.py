"""Everything that runs on a host. It travels on the stdin of the host's Python and runs there
with `python -I`, so it imports nothing but the standard library and `deploy.host` itself: a
host has only its own Python, and isolated mode keeps a `json.py` in the user's home from
shadowing a standard module. The agent (boot.py) loads the whole package from its stdin;
`probe.py` also travels alone, as a request's body, for an environment's Python to run
(deploy/plan/checks.py). A task's supervisor, which must outlive the agent, is the host's
/bin/sh (supervisor.py).
"""
