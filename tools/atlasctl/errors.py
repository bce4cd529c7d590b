"""Errors that atlasctl reports to the user as one clear line, without a traceback."""

from atlasctl import exitcodes


class AtlasError(Exception):
    """An error with a message that names the input and the fix."""

    exit_code = exitcodes.FAILED

    def __init__(self, message: str, *, fix: str | None = None):
        super().__init__(message)
        self.fix = fix

    def render(self) -> str:
        text = str(self)
        if self.fix:
            text += f"\n  fix: {self.fix}"
        return text


class UsageError(AtlasError):
    exit_code = exitcodes.USAGE


class EnvironmentProblem(AtlasError):
    exit_code = exitcodes.ENVIRONMENT
