"""Reaching hosts: one interface for running commands on a host (base.py), over SSH (ssh.py:
logins through gateways or a ProxyCommand, host keys as OpenSSH checks them) or as local
processes (local.py)."""

import logging

# paramiko logs a connection's failure (with its traceback) from its own thread; the login
# turns it into one line naming the host (login.py): nothing of paramiko's reaches the console.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False
