"""One root error type with two kinds, so the command line can tell a user's mistake from a
failure out there, and both from a bug: anything that is not a TfdeployError is a bug in
tfdeploy and keeps its traceback.
"""


class TfdeployError(Exception):
    exit_code = 1


class BadInput(TfdeployError):
    """The inventory, a flag, the payload or a local record is wrong: nothing was touched on
    any host. Exit status 2."""
    exit_code = 2


class Failure(TfdeployError):
    """A host or the run failed; the message names the host and the cause. Exit status 1."""
    exit_code = 1
