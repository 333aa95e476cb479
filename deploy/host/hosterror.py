"""What a host cannot do, apart from the protocol (protocol.py): the task supervisor
(supervisor.py), which starts once per task, imports this and not the protocol's types."""


class HostError(Exception):
    """What a host cannot do, in words for the user (a directory that is not a run's, a task
    that is not one, data that is not there): the agent answers it as the request's error."""
