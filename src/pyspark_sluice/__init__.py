"""The `sluice` data source under the name Spark's data source discovery looks for.

Spark 4 looks, once per session, through the Python path for top-level modules named
`pyspark_*` whose `DefaultSource` is a `DataSource`, and registers each under its `name()`: so
with Sluice installed, `spark.read.format("sluice")` works without `sluice.spark.register`.
"""

from sluice.spark.source import SluiceDataSource as DefaultSource

__all__ = ["DefaultSource"]
