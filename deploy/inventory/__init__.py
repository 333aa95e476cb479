"""The host inventory: frozen values (model.py), loaded and validated once (load.py), with
ssh config resolution (sshconfig.py) and the built-in default (builtin.py)."""
