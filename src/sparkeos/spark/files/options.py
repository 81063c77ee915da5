"""Options of the `sparkeos.files` sink, and the checks of the input schema made before a query writes anything."""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql.types import ArrayType, BinaryType, MapType, StructType

from ..options import OptionError

FORMATS = ("parquet", "json", "csv")
# Spark's names for each format's codecs, mapped to pyarrow's (None: no compression).
PARQUET_CODECS = {"none": None, "uncompressed": None, "snappy": "snappy", "gzip": "gzip", "lz4": "lz4",
                  "zstd": "zstd", "brotli": "brotli"}
STREAM_CODECS = {"none": None, "uncompressed": None, "gzip": "gzip", "bzip2": "bz2", "zstd": "zstd", "lz4": "lz4"}
DEFAULT_CODEC = {"parquet": "snappy", "json": "none", "csv": "none"}
OPTIONS = ("path", "format", "compression", "partitionBy", "header", "maxRecordsPerFile", "writeId")
# Hadoop's S3A names, as Spark users set them, for S3 and S3-compatible stores; without them pyarrow finds
# credentials and the region the AWS way (environment, ~/.aws, instance metadata).
S3_OPTIONS = ("fs.s3a.endpoint", "fs.s3a.endpoint.region", "fs.s3a.access.key", "fs.s3a.secret.key",
              "fs.s3a.session.token", "fs.s3a.connection.ssl.enabled")
SPARK_OWNED = {"checkpointlocation", "queryname"}


class FileSinkOptionError(OptionError):
    """A bad option or input schema of the sparkeos.files sink; the message names it."""


@dataclass(frozen=True)
class FileSinkOptions:
    path: str
    format: str
    codec: str | None
    partition_by: tuple[str, ...]
    header: bool
    s3: tuple[tuple[str, str], ...] = ()
    max_records_per_file: int = 0  # Spark's: 0 or less is no limit


def parse_file_sink_options(raw: Mapping[str, str]) -> FileSinkOptions:
    """Spark hands option names lower-cased; every unknown one is an error naming it (and the likely intended)."""
    options = {str(k).lower(): str(v) for k, v in raw.items()}
    known = {name.lower(): name for name in OPTIONS + S3_OPTIONS}
    for name in options:
        if name in known or name in SPARK_OWNED:
            continue
        guess = difflib.get_close_matches(name, list(known), n=1)
        hint = f" (did you mean {known[guess[0]]!r}?)" if guess else ""
        raise FileSinkOptionError(f"unknown option {name!r} of the sparkeos.files sink{hint}; "
                                  f"known: {', '.join(OPTIONS)}")
    path = options.get("path", "").strip()
    if not path:
        raise FileSinkOptionError("option 'path' is required: the directory the sparkeos.files sink writes to")
    file_format = options.get("format", "parquet").strip().lower()
    if file_format not in FORMATS:
        raise FileSinkOptionError(f"option 'format' must be one of {', '.join(FORMATS)}, not {options['format']!r}")
    codecs = PARQUET_CODECS if file_format == "parquet" else STREAM_CODECS
    compression = options.get("compression", DEFAULT_CODEC[file_format]).strip().lower()
    if compression not in codecs:
        raise FileSinkOptionError(f"option 'compression' of format {file_format} must be one of "
                                  f"{', '.join(codecs)}, not {options['compression']!r}")
    header = options.get("header", "false").strip().lower()
    if header not in ("true", "false"):
        raise FileSinkOptionError(f"option 'header' must be true or false, not {options['header']!r}")
    if "header" in options and file_format != "csv":
        raise FileSinkOptionError("option 'header' applies to format csv only")
    s3 = tuple((name, options[name]) for name in S3_OPTIONS if name in options)
    if s3 and not path.startswith(("s3://", "s3a://")):
        raise FileSinkOptionError(f"option {s3[0][0]!r} applies to s3:// and s3a:// paths, not {path!r}")
    ssl = dict(s3).get("fs.s3a.connection.ssl.enabled", "true").strip().lower()
    if ssl not in ("true", "false"):
        raise FileSinkOptionError(f"option 'fs.s3a.connection.ssl.enabled' must be true or false, not {ssl!r}")
    max_records = options.get("maxrecordsperfile", "0").strip()
    if not max_records.lstrip("-").isdigit():
        raise FileSinkOptionError(f"option 'maxRecordsPerFile' must be a whole number (0 or less for no limit), not "
                                  f"{options['maxrecordsperfile']!r}")
    return FileSinkOptions(path, file_format, codecs[compression], _partition_columns(options.get("partitionby")),
                           header == "true", s3, max(int(max_records), 0))


def _partition_columns(text: str | None) -> tuple[str, ...]:
    if text is None or not text.strip():
        return ()
    text = text.strip()
    if text.startswith("["):
        try:
            names = json.loads(text)
        except ValueError as error:
            raise FileSinkOptionError(f"option 'partitionBy' is not a JSON list of column names: {error}") from None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise FileSinkOptionError("option 'partitionBy' must be column names, comma-separated or a JSON list")
    else:
        names = [name.strip() for name in text.split(",")]
    if any(not name for name in names):
        raise FileSinkOptionError(f"option 'partitionBy' has an empty column name: {text!r}")
    if len(set(names)) != len(names):
        raise FileSinkOptionError(f"option 'partitionBy' names a column twice: {text!r}")
    return tuple(names)


def check_input_schema(schema: StructType, options: FileSinkOptions) -> None:
    """The input must hold every partitionBy column, keep at least one data column, and fit the format."""
    names = schema.fieldNames()
    for column in options.partition_by:
        if column not in names:
            raise FileSinkOptionError(f"partitionBy column {column!r} is not in the input; columns: {', '.join(names)}")
        data_type = schema[column].dataType
        if isinstance(data_type, (ArrayType, MapType, StructType, BinaryType)):
            raise FileSinkOptionError(f"partitionBy column {column!r} has type {data_type.simpleString()}, which "
                                      "cannot name a directory")
    if len(options.partition_by) == len(names):
        raise FileSinkOptionError("every input column is a partitionBy column: no data column is left to write")
    if options.format == "csv":
        for column in schema.fields:
            if column.name in options.partition_by:
                continue
            if isinstance(column.dataType, (ArrayType, MapType, StructType, BinaryType)):
                raise FileSinkOptionError(f"column {column.name!r} has type {column.dataType.simpleString()}, which "
                                          "format csv cannot hold (as in Spark); use parquet or json, or cast it")
