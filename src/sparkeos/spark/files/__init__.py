"""The `sparkeos.files` sink: exactly-once parquet, JSON-lines and CSV files on the two-phase-commit framework."""

SHORT_NAME = "sparkeos.files"
