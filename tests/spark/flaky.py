"""A sluice sink whose first attempt at partition 0 fails, for the retry tests.

`format("sluice-flaky")` is the sluice data source with a batch writer that, on attempt 0 of
partition 0, fails in the way the `failure` option names:

- `midway`: after handing the sink `FAIL_AFTER` rows, so that part of the transaction is on the
  broker when the task dies;
- `after-commit`: after the transaction committed, as when a task's result is lost.

Every attempt leaves a file `p<partition>-a<attempt>` in the `markers` directory. The tests
register this module to be pickled by value: Spark's workers need not import it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark import TaskContext

from sluice.spark.options import sink_options
from sluice.spark.sink import SluiceBatchWriter, SluiceCommitMessage
from sluice.spark.source import SluiceDataSource

FAIL_AFTER = 100


class AttemptFailed(RuntimeError):
    """The planned failure of a first attempt."""


def _fail_after(batches: Iterator[Any], rows: int) -> Iterator[Any]:
    left = rows
    for batch in batches:
        if batch.num_rows >= left:
            yield batch.slice(0, left)
            raise AttemptFailed(f"attempt 0 dies after {rows} rows")
        left -= batch.num_rows
        yield batch
    raise AttemptFailed(f"attempt 0 dies at the end of its rows, before {rows}")


class FlakyWriter(SluiceBatchWriter):
    """The sluice batch writer; attempt 0 of partition 0 fails (see the module docstring)."""

    def __init__(self, options: dict[str, str], schema: Any) -> None:
        # `failure` and `markers` are this test sink's own options: the sluice sink refuses them.
        own = ("failure", "markers")
        super().__init__(sink_options({k: v for k, v in options.items() if k not in own}), schema)
        self.failure = options["failure"]
        self.markers = options["markers"]

    def write(self, iterator: Iterator[Any]) -> SluiceCommitMessage:
        context = TaskContext.get()
        assert context is not None
        partition, attempt = context.partitionId(), context.attemptNumber()
        Path(self.markers, f"p{partition}-a{attempt}").touch()
        first_try = partition == 0 and attempt == 0
        if first_try and self.failure == "midway":
            iterator = _fail_after(iterator, FAIL_AFTER)
        message = super().write(iterator)
        if first_try and self.failure == "after-commit":
            raise AttemptFailed("attempt 0 committed, then died before reporting it")
        return message


class FlakySource(SluiceDataSource):
    """`format("sluice-flaky")`."""

    @classmethod
    def name(cls) -> str:
        return "sluice-flaky"

    def writer(self, schema: Any, overwrite: bool) -> FlakyWriter:
        return FlakyWriter(dict(self.options), schema)
