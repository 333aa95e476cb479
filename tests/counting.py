"""A local host (transport: local) that counts the commands it is given: the pushes' tests
show how many commands a push costs a host."""
from __future__ import annotations

from deploy.transport.local import LocalTransport


class CountingTransport(LocalTransport):
    def __init__(self, host):
        super().__init__(host)
        self.commands = 0

    def run(self, *args, **kwargs):
        self.commands += 1
        return super().run(*args, **kwargs)
