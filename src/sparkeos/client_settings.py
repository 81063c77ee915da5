"""Kafka client settings given on a command line, as Kafka's tools take them: `--command-config FILE` (a Java
properties file of librdkafka's settings, e.g. a secured cluster's) and `-X KEY=VALUE`, each checked by librdkafka
before anything connects. `sparkeos lag` and `sparkeos demo --bootstrap-servers` read them."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterable
from pathlib import Path


class ClientSettingsError(ValueError):
    """A settings file that cannot be read, a malformed -X, or a setting librdkafka refuses; the message says which."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--command-config", type=Path, metavar="FILE",
                        help="a properties file of Kafka client settings (librdkafka's names), e.g. security")
    parser.add_argument("-X", dest="properties", action="append", default=[], metavar="KEY=VALUE",
                        help="one Kafka client setting (librdkafka's name); repeatable; overrides --command-config")


def read_properties(path: Path) -> dict[str, str]:
    """A Java properties file, as Kafka's tools read `--command-config`: `key=value` or `key: value` lines, `#` and
    `!` comments, a trailing backslash continues a line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ClientSettingsError(f"cannot read --command-config {path}: {exc}") from None
    properties: dict[str, str] = {}
    logical = ""
    for raw in text.splitlines():
        line = raw.lstrip()
        if not logical and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2:  # an odd number of backslashes: the line goes on
            logical += line[:-1]
            continue
        logical += line
        key, value = _split_property(logical)
        properties[key] = value
        logical = ""
    if logical:
        key, value = _split_property(logical)
        properties[key] = value
    return properties


def _split_property(line: str) -> tuple[str, str]:
    key, index = [], 0
    while index < len(line) and line[index] not in "=: \t\f":
        if line[index] == "\\" and index + 1 < len(line):
            index += 1
        key.append(line[index])
        index += 1
    rest = line[index:].lstrip(" \t\f")
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(" \t\f")
    return "".join(key), _unescape(rest)


def _unescape(text: str) -> str:
    out, index = [], 0
    while index < len(text):
        char = text[index]
        if char == "\\" and index + 1 < len(text):
            following = text[index + 1]
            if following == "u" and index + 6 <= len(text):
                out.append(chr(int(text[index + 2:index + 6], 16)))
                index += 6
                continue
            out.append({"t": "\t", "n": "\n", "r": "\r", "f": "\f"}.get(following, following))
            index += 2
            continue
        out.append(char)
        index += 1
    return "".join(out)


def client_config(bootstrap_servers: str, command_config: Path | None, properties: Iterable[str]) -> dict[str, str]:
    """The Kafka client properties: the --command-config file, then each -X KEY=VALUE, then --bootstrap-servers.
    librdkafka checks every name and value here, so a misspelled property is a usage error."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    config = read_properties(command_config) if command_config is not None else {}
    for item in properties:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ClientSettingsError(f"-X expects KEY=VALUE, got {item!r}")
        config[key.strip()] = value.strip()
    config["bootstrap.servers"] = bootstrap_servers
    quiet = logging.getLogger("sparkeos.client-settings")
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False  # warnings such as "group.id is a consumer property" are no error here
    try:
        AdminClient({**config, "logger": quiet})
    except KafkaException as exc:
        raise ClientSettingsError(f"bad Kafka client property: {exc.args[0].str()}") from None
    except (TypeError, ValueError) as exc:
        raise ClientSettingsError(f"bad Kafka client property: {exc}") from None
    return config
