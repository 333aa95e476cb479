"""Everything that runs on a host. It travels to the host as a zip (`tfdeploy-host.zip` in the
run directory) and runs there with `python -I`, so it imports nothing but the standard library
and `deploy.host` itself: a host has only its own Python, and isolated mode keeps a `json.py`
in the user's home from shadowing a standard module. `probe.py` travels on the stdin of the
host's python instead, because the check writes nothing on the host.
"""
