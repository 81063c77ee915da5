"""A pipeline as a user writes it, for the Python API of `sparkeos chaos`: the people-json example's transformation
as a function (adults, names in capitals)."""

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def adults_in_capitals(people: DataFrame) -> DataFrame:
    return people.where(F.col("age") >= 18).select("id", F.upper("name").alias("name"), "country")
