"""Reading a data source's options, and the one parser of durations.

Spark hands a data source its options with lower-cased names, so every lookup here is case-insensitive, and
every error names the option as the user spells it in the connector's documentation. A connector lists the
options it knows (for `sparkeos.kafka`, `sparkeos.spark.kafka.options`); a name it does not know is refused,
with the closest known one as a hint.

Durations are read the same way wherever they are given: options, executors' environment variables and job
files (`sparkeos.jobs.spec`).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping

# Options Spark itself adds to a data source's options.
SPARK_OWNED = {"path", "checkpointlocation", "queryname"}


class OptionError(ValueError):
    """A data source option is missing, unknown, malformed or contradicts another one."""


WRITE_ID_OPTION = "writeId"


def batch_write_id(raw: Mapping[str, str], what: str, streaming: bool) -> str | None:
    """The sinks' ``writeId``: the name of one batch write (``df.write``), so that the same write run again, after it
    failed or its driver died, finishes what the first run decided and writes nothing twice. A streaming query's
    checkpoint names its writes already."""
    value = next((str(v) for k, v in raw.items() if k.lower() == WRITE_ID_OPTION.lower()), None)
    if value is None:
        return None
    if streaming:
        raise OptionError(f"option '{WRITE_ID_OPTION}' applies to batch writes (df.write) of the {what} sink: a "
                          "streaming query's checkpoint names its writes")
    value = value.strip()
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", value):
        raise OptionError(f"option '{WRITE_ID_OPTION}' must be 1 to 64 letters, digits, '.', '_' or '-', not "
                          f"{value!r}")
    return value


class CaseInsensitiveOptions:
    """Case-insensitive view of Spark's options for a data source.

    `known` are the option names as documented; names starting with one of `passthrough_prefixes` are handed
    on to a client library and are not checked here. `what` names the data source in errors."""

    def __init__(self, raw: Mapping[str, str], known: Iterable[str], what: str,
                 passthrough_prefixes: tuple[str, ...] = ()):
        self.values = {key.lower(): str(value) for key, value in raw.items()}
        self.canonical = {name.lower(): name for name in known}
        self.what = what
        self.passthrough_prefixes = passthrough_prefixes
        self.check_unknown()

    def check_unknown(self) -> None:
        for key in self.values:
            if key in self.canonical or key in SPARK_OWNED or key.startswith(self.passthrough_prefixes):
                continue
            close = difflib.get_close_matches(key, self.canonical, n=1, cutoff=0.75)
            hint = f"; did you mean '{self.canonical[close[0]]}'?" if close else ""
            raise OptionError(f"unknown {self.what} option '{key}'{hint}")

    def get(self, name: str) -> str | None:
        return self.values.get(name.lower())

    def has(self, name: str) -> bool:
        return name.lower() in self.values

    def require(self, name: str) -> str:
        value = self.get(name)
        if value is None or not value.strip():
            raise OptionError(f"option '{name}' is required by the {self.what}")
        return value.strip()

    def boolean(self, name: str, default: bool) -> bool:
        value = self.get(name)
        if value is None:
            return default
        lowered = value.strip().lower()
        if lowered not in ("true", "false"):
            raise OptionError(f"option '{name}' must be true or false, got {value!r}")
        return lowered == "true"

    def integer(self, name: str, default: int | None, minimum: int = 0) -> int | None:
        value = self.get(name)
        if value is None:
            return default
        try:
            number = int(value.strip())
        except ValueError:
            raise OptionError(f"option '{name}' must be an integer, got {value!r}") from None
        if number < minimum:
            raise OptionError(f"option '{name}' must be at least {minimum}, got {number}")
        return number

    def duration_ms(self, name: str, default: str) -> int:
        """The option as a duration in milliseconds (see `duration_ms`), else `default`."""
        text = self.get(name) or default
        parsed = duration_ms(text)
        if parsed is None:
            raise OptionError(f"option '{name}' must be a duration such as 500ms, 30s or 15m, got {text!r}")
        return parsed

    def prefixed(self, prefix: str) -> dict[str, str]:
        """The options whose names start with `prefix`, without it: settings for a client library."""
        return {key[len(prefix):]: value for key, value in self.values.items() if key.startswith(prefix)}


_DURATION = re.compile(
    r"^\s*(\d+(?:\.\d+)?)\s*(ms|milliseconds?|s|sec|seconds?|m|min|minutes?|h|hours?|d)?\s*$", re.IGNORECASE
)
_UNIT_S = {"ms": 0.001, "millisecond": 0.001, "milliseconds": 0.001, "s": 1, "sec": 1, "second": 1, "seconds": 1,
           "m": 60, "min": 60, "minute": 60, "minutes": 60, "h": 3600, "hour": 3600, "hours": 3600, "d": 86_400}


def duration_s(text: str, default_unit: str = "ms") -> float | None:
    """A duration in seconds, or None if `text` is not one.

    A number, whole or decimal, and a unit: Spark's short ones (500ms, 30s, 15m, 1h, 2d, also min and sec) or
    spelled out (20 seconds, 1.5 minutes, 100 milliseconds, 2 hours). A number without a unit is in
    `default_unit`: milliseconds, as in Spark's durations, unless the caller says otherwise."""
    match = _DURATION.match(text)
    if not match:
        return None
    unit = (match.group(2) or default_unit).lower()
    return float(match.group(1)) * _UNIT_S[unit]


def duration_ms(text: str, default_unit: str = "ms") -> int | None:
    """A duration (see `duration_s`) in whole milliseconds, or None if `text` is not one."""
    seconds = duration_s(text, default_unit)
    return None if seconds is None else round(seconds * 1000)
