"""Errors the engine raises for bad input; each message is meant for the user as is."""


class EngineError(Exception):
    """Base of every error the CLI and the server show to a user without a traceback."""


class ModelLoadError(EngineError):
    """A model directory is missing, incomplete, or of an unknown format."""


class InputError(EngineError):
    """A request or input file cannot be used."""
