"""The `sluice-journal` data source under the name Spark's data source discovery looks for
(see `pyspark_sluice`)."""

from sluice.spark.journal_source import SluiceJournalDataSource as DefaultSource

__all__ = ["DefaultSource"]
