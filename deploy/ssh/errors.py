"""The failure of an SSH login, shared by the modules that make one."""
from __future__ import annotations

from deploy.errors import Failure


class LoginFailed(Failure):
    """A login or a channel failed; the message names the hop (and the host, for its own)."""
