"""The tuner's error hierarchy; only the CLI turns these into messages and exit codes."""


class TunerError(Exception):
    """Base class for every error the tuner reports to a user."""

    exit_code = 2


class ConfigError(TunerError):
    """A profile spec, setting or command-line value is invalid."""


class BenchError(TunerError):
    """The bundled bench (llama.cpp build or bench models) could not be set up or found."""


class ServerError(TunerError):
    """A llama-server could not be started, answered wrongly or died."""


class ServerStartError(ServerError):
    """llama-server exited or never became healthy at start-up."""


class ServerDiedError(ServerError):
    """llama-server exited (by a signal or with a status) while the tuner needed it."""

    def __init__(self, message: str, returncode: int | None = None) -> None:
        super().__init__(message)
        self.returncode = returncode


class EndpointMissingError(ServerError):
    """The server has an endpoint switched off (HTTP 404/501: /slots, /metrics, POST /props);
    the message names the flag that turns it on."""

    def __init__(self, message: str, path: str = "", status: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.status = status


class ApiKeyError(ServerError):
    """The server wants an API key, or rejected the one given (HTTP 401)."""


class NotLlamaServerError(ServerError):
    """The URL answers, but not as a llama-server (GET /props without total_slots)."""


class PortInUseError(ServerError):
    """The requested port is already taken by another process."""


class LoadError(TunerError):
    """A measurement level failed: requests timed out or errored."""


class StorageError(TunerError):
    """The database could not be read or written."""


class NotFoundError(TunerError):
    """A run, model, fit or host the user named does not exist."""


class NothingToDoError(TunerError):
    """There is no data to work from; the message names the command that would provide it."""

    exit_code = 1


class InterruptedRun(TunerError):
    """The user interrupted a run; completed work is kept and can be resumed."""

    exit_code = 130
