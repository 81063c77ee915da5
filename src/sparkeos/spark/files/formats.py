"""Writing Arrow record batches as one parquet, JSON-lines or CSV file."""

from __future__ import annotations

import datetime
import json

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from ..json_text import json_text

EXTENSIONS = {"parquet": ".parquet", "json": ".json", "csv": ".csv"}
# Spark hands a writer small Arrow batches; a parquet row group per batch would make files larger and slower to
# write and to read, so batches are gathered into row groups of about this many rows.
ROW_GROUP_ROWS = 1 << 17
CODEC_EXTENSIONS = {"gzip": ".gz", "bz2": ".bz2", "zstd": ".zst", "lz4": ".lz4"}


def file_extension(file_format: str, codec: str | None) -> str:
    """`.parquet` whatever its codec (as Spark's readers expect); `.json.gz` and the like for stream codecs."""
    if file_format == "parquet" or codec is None:
        return EXTENSIONS[file_format]
    return EXTENSIONS[file_format] + CODEC_EXTENSIONS[codec]


class FormatWriter:
    """One output file: ``write`` record batches of ``schema``, then ``close``."""

    def __init__(self, stream: pa.NativeFile, schema: pa.Schema, file_format: str, codec: str | None, header: bool):
        self.records = 0
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._raw = stream
        if file_format == "parquet":
            self._stream = stream
            self._parquet = pq.ParquetWriter(stream, schema, compression=codec or "none")
        else:
            self._stream = pa.CompressedOutputStream(stream, codec) if codec else stream
            self._parquet = None
        self._csv = (pa_csv.CSVWriter(self._stream, schema, write_options=pa_csv.WriteOptions(include_header=header))
                     if file_format == "csv" else None)

    def write(self, rows: pa.RecordBatch) -> None:
        self.records += rows.num_rows
        if self._parquet is not None:
            self._pending.append(rows)
            self._pending_rows += rows.num_rows
            if self._pending_rows >= ROW_GROUP_ROWS:
                self._write_row_group()
        elif self._csv is not None:
            self._csv.write_batch(rows)
        else:
            self._stream.write(json_lines(rows))

    def _write_row_group(self) -> None:
        self._parquet.write_table(pa.Table.from_batches(self._pending), row_group_size=self._pending_rows)
        self._pending, self._pending_rows = [], 0

    def close(self) -> None:
        if self._parquet is not None:
            if self._pending:
                self._write_row_group()
            self._parquet.close()
        elif self._csv is not None:
            self._csv.close()
        if self._stream is not self._raw:
            self._stream.close()
        if not self._raw.closed:
            self._raw.close()


def json_lines(rows: pa.RecordBatch) -> bytes:
    """One JSON object per row, as Spark's JSON writer writes them: null fields left out, binary in base64,
    timestamps in ISO 8601, decimals as numbers."""
    names = rows.schema.names
    columns = [column.to_pylist() for column in rows.columns]
    lines = []
    for index in range(rows.num_rows):
        fields = [f"{json.dumps(name)}:{json_text(column[index], spark_datetime)}"
                  for name, column in zip(names, columns, strict=True) if column[index] is not None]
        lines.append("{" + ",".join(fields) + "}\n")
    return "".join(lines).encode()


def spark_datetime(value: datetime.date) -> str:
    """As Spark's JSON writer: timestamps in UTC with milliseconds, dates as yyyy-MM-dd."""
    if isinstance(value, datetime.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(datetime.UTC)
        return value.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    return value.isoformat()
