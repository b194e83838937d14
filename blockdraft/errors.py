"""Exception types raised by blockdraft.

Every error a user can cause (bad flag, bad file, mismatched pair) is a `BlockdraftError` whose message
is one line naming the bad value and what was expected. The CLI prints it and exits non-zero.
"""


class BlockdraftError(Exception):
    """Base class of every error blockdraft raises on purpose."""


class InvalidArgumentError(BlockdraftError, ValueError):
    """A parameter is out of range or of the wrong kind."""


class CheckpointError(BlockdraftError):
    """A checkpoint folder is missing, unreadable or not in a supported format."""


class IncompatibleModelsError(BlockdraftError):
    """The drafter does not fit the target (width, depth, vocabulary)."""


class MissingDependencyError(BlockdraftError):
    """An optional package needed for this path is not installed."""


def require_extra(what: str, extra: str, modules: tuple[str, ...]) -> None:
    """Raise a one-line `MissingDependencyError` naming the extra to install when any of `modules` (top-level
    import names of that extra's packages) is missing: `what` (e.g. "blockdraft serve") then stops before any work."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise MissingDependencyError(f"{what} needs the '{extra}' extra ({', '.join(missing)} not installed): "
                                     f'pip install "blockdraft[{extra}]"')
