"""The errors msbridge raises on purpose; each one says how to fix it."""
from __future__ import annotations

import re
from typing import Iterable, List

_OS_ERROR = re.compile(r"\[Errno -?\d+\] [^\"'()\[\]]+")

from .masking import mask_text


class MsbridgeError(Exception):
    """Base class of msbridge's own errors."""


class ConfigError(MsbridgeError, ValueError):
    """A config problem found before training starts.

    ``problems`` holds one line per problem, each naming the file, line and key
    where known, so every mistake in a file is reported at once.

    Example:
        >>> raise ConfigError(["run.yaml:4: monitor_config.intreval: unknown key; did you mean 'interval'?"])
        Traceback (most recent call last):
        msbridge.errors.ConfigError: run.yaml:4: monitor_config.intreval: unknown key; did you mean 'interval'?
    """

    def __init__(self, problems: "str | Iterable[str]") -> None:
        problems = [problems] if isinstance(problems, str) else list(problems)
        self.problems: List[str] = [mask_text(p) for p in problems]  # a value may carry a URL with a password
        super().__init__("\n".join(self.problems))


class MissingDependencyError(MsbridgeError, ImportError):
    """An optional package that a chosen sink (or ``msbridge.mindformers``) needs is not installed.

    Example:
        >>> try:
        ...     raise MissingDependencyError("sink 'mlflow'", "mlflow", "mlflow")
        ... except ImportError as exc:  # it is an ImportError too
        ...     print(exc.fix)
        pip install 'msbridge[mlflow]'
    """

    def __init__(self, needed_by: str, module: str, extra: str) -> None:
        fix = f"pip install 'msbridge[{extra}]'" if extra else f"pip install {module}"
        super().__init__(f"{needed_by} needs the Python package {module!r}, which is not installed; fix: {fix}")
        self.fix = fix


def exception_text(exc: BaseException, limit: int = 300) -> str:
    """``Type: message`` of ``exc`` on one line, never cut mid-word.

    A longer message that wraps an OS error (a refused connection inside MLflow's
    HTTP error) is given as that error; any other keeps its first whole sentences
    that fit, then ``(...)``.

    Example:
        >>> exception_text(OSError("HTTPConnectionPool(...): Max retries exceeded (Caused by NewConnectionError("
        ...                        "'[Errno 111] Connection refused'))"), limit=40)
        'OSError: [Errno 111] Connection refused'
    """
    name = type(exc).__name__
    text = " ".join(f"{name}: {exc}".split())
    if len(text) <= limit:
        return text
    found = _OS_ERROR.findall(text)
    if found:
        return f"{name}: {found[-1].strip()}"
    cut = text[:limit]
    end = max(cut.rfind(". "), cut.rfind("; "))
    cut = cut[:end + 1] if end > len(name) + 2 else cut[:cut.rfind(" ")]
    return f"{cut} (...)"
