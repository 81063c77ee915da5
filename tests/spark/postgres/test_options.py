"""Options and type mapping of the `sparkeos.postgres` sink, without Spark; the upsert keys' index on a real
server."""

from __future__ import annotations

import pytest
from pyspark.sql.types import ArrayType, DecimalType, IntegerType, LongType, MapType, StringType, StructType

from sparkeos.spark.options import OptionError
from sparkeos.spark.postgres.options import PostgresSinkOptionError, TableName, parse_postgres_sink_options
from sparkeos.spark.postgres.types import UnsupportedColumnType, accepts, postgres_type


def test_options_are_read_case_insensitively_with_defaults():
    options = parse_postgres_sink_options({"URL": "jdbc:postgresql://h:5/db?user=u", "DBTABLE": 'S."My Table"',
                                           "upsertkeys": "a, b", "createtable": "true", "checkpointLocation": "x"})
    assert options.url == "postgresql://h:5/db?user=u"
    assert options.table == TableName("s", "My Table")
    assert options.exactly_once and options.create_table and options.batch_size == 1000
    assert options.upsert_keys == ("a", "b")
    assert not parse_postgres_sink_options({"url": "u", "dbtable": "t",
                                            "deliveryGuarantee": "AT_LEAST_ONCE"}).exactly_once


@pytest.mark.parametrize(("raw", "message"), [
    ({"dbtable": "t"}, "option 'url' is required"),
    ({"url": "u"}, "option 'dbtable' is required"),
    ({"url": "u", "dbtable": "a.b.c"}, "option 'dbtable' must be a table or schema.table"),
    ({"url": "u", "dbtable": "t", "deliveryGuarantee": "exactly-once"}, "option 'deliveryGuarantee' must be one of"),
    ({"url": "u", "dbtable": "t", "batchSize": "0"}, "option 'batchSize' must be at least 1"),
    ({"url": "u", "dbtable": "t", "upsertKeys": "a,,b"}, "option 'upsertKeys' has an empty column name"),
    ({"url": "u", "dbtable": "t", "createTabel": "true"}, "unknown sparkeos.postgres sink option 'createtabel'; "
                                                          "did you mean 'createTable'"),
    ({"url": "u", "dbtable": "t", "path": "/x"}, "takes no path"),
])
def test_bad_options_fail_naming_them(raw, message):
    with pytest.raises(PostgresSinkOptionError, match=message) as caught:
        parse_postgres_sink_options(raw)
    assert isinstance(caught.value, OptionError)


def test_types_created_and_accepted():
    assert postgres_type(ArrayType(ArrayType(LongType())), "a") == "bigint[]"
    assert postgres_type(MapType(StringType(), LongType()), "m") == "jsonb"
    assert postgres_type(DecimalType(10, 2), "d") == "numeric(10,2)"
    assert accepts(IntegerType(), "bigint") and not accepts(LongType(), "integer")
    assert accepts(DecimalType(10, 2), "numeric(12,2)") and not accepts(DecimalType(10, 2), "numeric(9,2)")
    assert not accepts(DecimalType(10, 2), "numeric(12,3)")
    assert accepts(StringType(), "character varying(20)") and not accepts(StringType(), "text[]")
    assert accepts(ArrayType(IntegerType()), "bigint[]") and not accepts(ArrayType(IntegerType()), "integer")
    assert accepts(StructType(), "json")
    from pyspark.sql.types import DayTimeIntervalType

    with pytest.raises(UnsupportedColumnType, match="column 'span' has type interval day to second"):
        postgres_type(DayTimeIntervalType(), "span")


@pytest.mark.parametrize(("index", "usable"), [
    ("PRIMARY KEY (b, a)", True),
    ("UNIQUE (a, b) INCLUDE (c)", True),
    ("UNIQUE (a)", False),
    ("UNIQUE (a, b, c)", False),
    ("UNIQUE (a, b) DEFERRABLE", False),
    (None, False),
])
def test_upsert_keys_need_a_unique_index_postgres_can_take_as_the_arbiter(postgres, index, usable):
    """ON CONFLICT (a, b) infers its arbiter from a unique index on exactly (a, b), in any order, that is immediate
    and has no predicate; anything else fails the query before it writes, naming the keys and the indexes found."""
    import uuid

    from pyspark.sql.types import LongType, StructField, StructType

    from sparkeos.spark.postgres.options import parse_postgres_sink_options
    from sparkeos.spark.postgres.sink import PostgresSink, PostgresSinkError

    table = f"t_{uuid.uuid4().hex[:10]}"
    with postgres.connect() as connection:
        connection.execute(f"CREATE TABLE {table} (a bigint, b bigint, c bigint{', ' + index if index else ''})")
    schema = StructType([StructField(name, LongType()) for name in "abc"])
    sink = PostgresSink(parse_postgres_sink_options({"url": postgres.url(), "dbtable": table, "upsertKeys": "a,b"}),
                        schema)
    if usable:
        sink.prepare()
    else:
        with pytest.raises(PostgresSinkError, match=r"upsertKeys \(a, b\) cannot be used with table .*the table's "
                                                    "unique indexes: "):
            sink.prepare()
