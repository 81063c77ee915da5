"""The `sparkeos.files` data source: an exactly-once file sink whose output any directory reader can trust."""

from __future__ import annotations

from collections import Counter

from pyspark.sql.types import StructType

from ..reader_view import record_texts
from ..two_phase_commit import TwoPhaseCommitDataSource
from .options import check_input_schema, parse_file_sink_options
from .sink import FileSink


class FilesDataSource(TwoPhaseCommitDataSource):
    read_hint = ("read its directory with any reader (spark.read.parquet(path), pyarrow.dataset, DuckDB, pandas)")

    @classmethod
    def name(cls) -> str:
        return "sparkeos.files"

    visible_output_unit = "files"

    @classmethod
    def target_beside(cls, options: dict[str, str], prefix: str) -> tuple[dict[str, str], str]:
        """A directory of the run's own beside the job's, in the same parent (bucket, file system): its last name
        behind ``prefix``."""
        path = parse_file_sink_options(options).path
        scheme, found, rest = path.partition("://")
        if not found:
            scheme, rest = "", path
        authority, slash, tail = rest.partition("/") if found else ("", "", rest)
        parent, separator, name = tail.rstrip("/").rpartition("/")
        if not name:
            raise ValueError(f"the output path {path!r} names no directory to put one beside")
        beside = (f"{scheme}://{authority}{slash}" if found else "") + parent + separator + prefix + name
        return {"path": beside}, f"{beside} (the run's directory beside the job's own)"

    @classmethod
    def visible_output(cls, options: dict[str, str]) -> int:
        """The data files a reader of the directory ``options`` name lists (none under a ``_`` or ``.`` name)."""
        from pyarrow import fs as pafs

        from ...locations import open_location

        filesystem, root = open_location(parse_file_sink_options(options).path)
        listed = filesystem.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
        return sum(1 for info in listed if info.type == pafs.FileType.File
                   and not any(part.startswith(("_", ".")) for part in info.path[len(root):].split("/")))

    @classmethod
    def visible_records(cls, options: dict[str, str]) -> Counter[str]:
        """The rows a reader of the directory ``options`` name sees now: pyarrow.dataset's listing (no path under a
        ``_`` or ``.`` name), each file read with its own schema and its partition values (as text) from its
        directory names (see ``reader_view``). File by file: a dataset's one schema, inferred from its first file,
        changes as files come, and with it how the same row reads."""
        import pyarrow as pa
        import pyarrow.dataset as ds
        from pyarrow import fs as pafs

        from ...locations import open_location

        parsed = parse_file_sink_options(options)
        filesystem, root = open_location(parsed.path)
        if filesystem.get_file_info(root).type == pafs.FileType.NotFound:
            return Counter()
        file_format: str | ds.FileFormat = parsed.format
        if parsed.format == "csv":
            import pyarrow.csv

            file_format = ds.CsvFileFormat(read_options=pyarrow.csv.ReadOptions(
                autogenerate_column_names=not parsed.header))
        partitioning = ds.partitioning(pa.schema([(name, pa.string()) for name in parsed.partition_by]),
                                       flavor="hive")
        dataset = ds.dataset(root, filesystem=filesystem, format=file_format, partitioning=partitioning)
        rows = []
        for fragment in dataset.get_fragments():
            keys = ds.get_partition_keys(fragment.partition_expression)
            rows += [{**row, **keys} for row in fragment.to_table(schema=fragment.physical_schema).to_pylist()]
        return record_texts(rows)

    @classmethod
    def operator_sink(cls, options: dict[str, str]) -> FileSink:
        """The sink at the directory ``options`` name, for ``sparkeos sinks``."""
        return FileSink(parse_file_sink_options(options))

    def sink(self, schema: StructType) -> FileSink:
        options = parse_file_sink_options(self.options)
        check_input_schema(schema, options)
        sink = FileSink(options)
        sink.prepare()
        return sink
