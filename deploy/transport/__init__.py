"""Reaching hosts: one interface for running commands on a host (base.py), over SSH (ssh.py:
logins through gateways or a ProxyCommand, host keys as OpenSSH checks them) or as local
processes (local.py)."""
