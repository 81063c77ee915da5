"""What the file sink needs of S3 beyond pyarrow's file system: writing an object only if none is there, and
copying an object of any size.

pyarrow has no conditional write; S3's ``PutObject`` with ``If-None-Match: *`` (and S3-compatible stores that
honour it) creates an object only where none exists, atomically. pyarrow copies with one ``CopyObject``, which S3
refuses above 5 GiB; boto3's managed copy copies large objects in parts (``UploadPartCopy``), and the object
appears whole when the upload completes. The client takes Hadoop's ``fs.s3a.*`` settings, as the sink's pyarrow
file system does.
"""

from __future__ import annotations

from collections.abc import Mapping


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

    def put_if_absent(self, path: str, data: bytes) -> bool:
        """Create the object at ``path`` (``bucket/key``) with ``data`` unless one is there; whether it was created."""
        from botocore.exceptions import ClientError

        bucket, _, key = path.partition("/")
        try:
            self.client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code")
            if code in ("PreconditionFailed", "412"):
                return False
            raise
        return True

    def copy(self, source: str, target: str) -> None:
        """Copy the object at ``source`` to ``target`` (both ``bucket/key``): in parts above boto3's multipart
        threshold, whole below it. Repeatable: a copy done again writes the same bytes under the same name."""
        source_bucket, _, source_key = source.partition("/")
        bucket, _, key = target.partition("/")
        self.client.copy({"Bucket": source_bucket, "Key": source_key}, bucket, key)
