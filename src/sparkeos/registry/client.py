"""How our clients reach a schema registry: its URL, or the settings of Confluent's schema registry clients.

A registry is named by its URL (`http://registry:8081`) or by a mapping of Confluent's client settings, the names
confluent-kafka's `SchemaRegistryClient` takes (and the Java serdes' `basic.auth.credentials.source`):

- `url` (required): `http://` or `https://`; credentials in it (`https://user:password@host`) are used;
- `basic.auth.user.info`: `user:password`, in place of credentials in the URL (both is an error, as
  confluent-kafka's client says);
- `basic.auth.credentials.source`: `URL` or `USER_INFO`, as the Java serdes take it (by default `USER_INFO` when
  `basic.auth.user.info` is given, else `URL`);
- `ssl.ca.location`: a PEM file of the authorities a `https://` registry's certificate is checked against (the
  system's by default).

Requests go through the standard library (`urllib`), on the driver and in Python workers alike: a worker fetches
each writer schema once. Settings are checked when they are made, with an error naming the setting.
"""

from __future__ import annotations

import base64
import json
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
SETTINGS = ("url", "basic.auth.credentials.source", "basic.auth.user.info", "ssl.ca.location")
CREDENTIALS_SOURCES = ("URL", "USER_INFO")
TIMEOUT_S = 30.0


class RegistryRequestError(RuntimeError):
    """The registry answered with an error, or could not be reached; `status` is the HTTP status (0 when none)."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Registry:
    """A schema registry and how to reach it; hashable, so that workers can key their caches by it."""

    url: str  # without credentials
    user_info: str | None = field(default=None, repr=False)  # "user:password"
    ca_location: str | None = None

    @classmethod
    def of(cls, registry: str | Mapping[str, Any] | Registry) -> Registry:
        """From a URL or a mapping of Confluent's client settings; ValueError naming the setting that is wrong."""
        if isinstance(registry, Registry):
            return registry
        settings: dict[str, str] = {}
        if isinstance(registry, str):
            settings = {"url": registry}
        elif isinstance(registry, Mapping):
            settings = {str(key): str(value) for key, value in registry.items() if value is not None}
        else:
            raise ValueError("a schema registry is a URL or a mapping of client settings, not "
                             f"{type(registry).__name__}")
        unknown = sorted(set(settings) - set(SETTINGS))
        if unknown:
            raise ValueError(f"unknown schema registry setting {unknown[0]!r} (known: {', '.join(SETTINGS)})")
        url = settings.get("url", "")
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"schema registry setting 'url' must be an http(s) URL, got {without_password(url)!r}")
        source = settings.get("basic.auth.credentials.source",
                              "USER_INFO" if "basic.auth.user.info" in settings else "URL").upper()
        if source not in CREDENTIALS_SOURCES:
            raise ValueError(f"schema registry setting 'basic.auth.credentials.source' must be one of "
                             f"{', '.join(CREDENTIALS_SOURCES)}, got {source!r}")
        in_url = (f"{urllib.parse.unquote(parts.username or '')}:{urllib.parse.unquote(parts.password or '')}"
                  if parts.username is not None else None)
        if in_url is not None and "basic.auth.user.info" in settings:
            raise ValueError("schema registry credentials are given twice, in 'url' and in 'basic.auth.user.info': "
                             "give one of them")
        if source == "URL" and "basic.auth.user.info" in settings:
            raise ValueError("schema registry setting 'basic.auth.user.info' is not used with "
                             "basic.auth.credentials.source URL: set USER_INFO, or leave the source out")
        user_info = settings.get("basic.auth.user.info") if source == "USER_INFO" else in_url
        if source == "USER_INFO" and not user_info:
            raise ValueError("schema registry setting 'basic.auth.user.info' (user:password) is required with "
                             "basic.auth.credentials.source USER_INFO")
        if user_info is not None and ":" not in user_info:
            raise ValueError("schema registry setting 'basic.auth.user.info' must be user:password")
        ca = settings.get("ssl.ca.location")
        if ca and parts.scheme != "https":
            raise ValueError("schema registry setting 'ssl.ca.location' applies to an https URL, not "
                             f"{without_password(url)}")
        if ca and not Path(ca).is_file():
            raise ValueError(f"schema registry setting 'ssl.ca.location' names no file: {ca}")
        bare = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2])).rstrip("/")
        return cls(bare, user_info or None, ca or None)

    @property
    def user(self) -> str | None:
        return self.user_info.split(":", 1)[0] if self.user_info else None

    def __str__(self) -> str:
        """The registry as logs and reports may show it: its URL and its user, never the password."""
        return f"{self.url} (as {self.user})" if self.user else self.url

    def confluent_config(self) -> dict[str, str]:
        """The settings of confluent-kafka's SchemaRegistryClient."""
        config = {"url": self.url}
        if self.user_info:
            config["basic.auth.user.info"] = self.user_info
        if self.ca_location:
            config["ssl.ca.location"] = self.ca_location
        return config

    # -- requests ---------------------------------------------------------------------------------------------

    def get(self, path: str) -> Any:
        return self._request(urllib.request.Request(f"{self.url}{path}", method="GET"), path)

    def post(self, path: str, body: dict) -> Any:
        request = urllib.request.Request(f"{self.url}{path}", data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": CONTENT_TYPE})
        return self._request(request, path)

    def _request(self, request: urllib.request.Request, path: str) -> Any:
        if self.user_info:
            token = base64.b64encode(self.user_info.encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        try:
            context = ssl.create_default_context(cafile=self.ca_location) if self.url.startswith("https") else None
            with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=context) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            answer = exc.read().decode(errors="replace")
            if exc.code == 401:
                who = f"the credentials of {self.user}" if self.user else "a request without credentials"
                raise RegistryRequestError(f"schema registry {self} refused {who} (401 Unauthorized): set "
                                           "basic.auth.user.info", exc.code) from None
            raise RegistryRequestError(f"schema registry {self} refused {path}: {exc.code} {answer}",
                                       exc.code) from None
        except urllib.error.URLError as exc:
            reason = exc.reason
            hint = (" (is ssl.ca.location the authority that signed its certificate?)"
                    if isinstance(reason, ssl.SSLCertVerificationError) else "")
            raise RegistryRequestError(f"schema registry {self} could not be reached for {path}: {reason}{hint}") \
                from None
        except (OSError, ValueError) as exc:  # a timeout while reading, a CA file that is not PEM, not JSON
            raise RegistryRequestError(f"schema registry {self} failed {path}: {type(exc).__name__}: {exc}") \
                from None


def without_password(url: str) -> str:
    """A URL as a log or a report may show it: without the password of its user part, even in a URL that is not
    one (`user:password@host`, a scheme missing)."""
    return re.sub(r"([^/@:]*):[^/@]*@", r"\1@", url, count=1)


RegistrySettings = str | Mapping[str, str] | Registry  # a URL, or Confluent's client settings
