"""What the sinks need of S3 beyond pyarrow's file system: writing an object only if none is there, and copying an
object of any size.

pyarrow has no conditional write; S3's ``PutObject`` with ``If-None-Match: *`` (and S3-compatible stores that
honour it) creates an object only where none exists, atomically. pyarrow copies with one ``CopyObject``, which S3
refuses above 5 GiB; boto3's managed copy copies large objects in parts (``UploadPartCopy``), and the object
appears whole when the upload completes. The client takes Hadoop's ``fs.s3a.*`` settings, as the file sink's pyarrow
file system does, or the settings of an ``s3://`` URI as pyarrow reads them (``for_uri``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

CONFLICT_RETRIES = 6


class S3Client:
    def __init__(self, settings: Mapping[str, str]):
        # Imported here: boto3 takes a noticeable while to import, and only drivers writing to S3 need it.
        import boto3
        from botocore.config import Config

        arguments: dict = {}
        endpoint = settings.get("fs.s3a.endpoint")
        if endpoint:
            if "://" not in endpoint:
                ssl = settings.get("fs.s3a.connection.ssl.enabled", "true").lower() == "true"
                endpoint = f"{'https' if ssl else 'http'}://{endpoint}"
            arguments["endpoint_url"] = endpoint.rstrip("/")
        for option, argument in (("fs.s3a.endpoint.region", "region_name"), ("fs.s3a.access.key", "aws_access_key_id"),
                                 ("fs.s3a.secret.key", "aws_secret_access_key"),
                                 ("fs.s3a.session.token", "aws_session_token")):
            if option in settings:
                arguments[argument] = settings[option]
        self.client = boto3.client("s3", config=Config(retries={"mode": "standard"}), **arguments)

    @classmethod
    def for_uri(cls, uri: str) -> S3Client:
        """The client for an ``s3://[access:secret@]bucket/path[?endpoint_override=host:port&scheme=http&region=r]``
        URI, with the settings pyarrow's ``FileSystem.from_uri`` takes from it; boto3's own (environment, profile)
        for the rest."""
        from urllib.parse import parse_qs, unquote, urlsplit

        parts = urlsplit(uri)
        query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
        settings = {}
        if "endpoint_override" in query:
            endpoint = query["endpoint_override"]
            settings["fs.s3a.endpoint"] = endpoint if "://" in endpoint else f"{query.get('scheme', 'https')}://{endpoint}"
        if "region" in query:
            settings["fs.s3a.endpoint.region"] = query["region"]
        if parts.username:
            settings["fs.s3a.access.key"] = unquote(parts.username)
            settings["fs.s3a.secret.key"] = unquote(parts.password or "")
        return cls(settings)

    def put_if_absent(self, path: str, data: bytes) -> bool:
        """Create the object at ``path`` (``bucket/key``) with ``data`` unless one is there; whether it was created."""
        from botocore.exceptions import ClientError

        bucket, _, key = path.partition("/")
        for attempt in range(CONFLICT_RETRIES):
            try:
                self.client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
            except ClientError as error:
                code = error.response.get("Error", {}).get("Code")
                if code in ("PreconditionFailed", "412"):
                    return False
                # Another conditional write of the key is under way: it creates the object, or fails and leaves
                # the key to a retry.
                if code in ("ConditionalRequestConflict", "409") and attempt + 1 < CONFLICT_RETRIES:
                    time.sleep(0.05 * 2 ** attempt)
                    continue
                raise
            return True
        raise AssertionError("unreachable")

    def copy(self, source: str, target: str) -> None:
        """Copy the object at ``source`` to ``target`` (both ``bucket/key``): in parts above boto3's multipart
        threshold, whole below it. Repeatable: a copy done again writes the same bytes under the same name."""
        source_bucket, _, source_key = source.partition("/")
        bucket, _, key = target.partition("/")
        self.client.copy({"Bucket": source_bucket, "Key": source_key}, bucket, key)
