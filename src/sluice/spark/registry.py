"""Registering Python data sources so that several queries can use one at the same time.

PySpark's `spark.dataSource.register(cls)` wraps the class in one JVM `PythonFunction` whose
environment is a plain `java.util.HashMap`. Spark 4 hands that same map to every Python runner it
builds for the source (planning, reading, writing, commits, the streaming source process), and
each runner adds its settings to it with `put`, without a lock. When two queries start together
(a pipeline that reads a topic into Parquet and into a queue, say), two driver threads add keys at
once and the map's size stops matching its entries. From then on every task that carries the map
fails to deserialize (`java.io.OptionalDataException` in `HashMap.readObject`), for every later
query of the session that uses the source.

`register_data_source` registers the class the same way, but with a
`java.util.concurrent.ConcurrentHashMap`: concurrent puts are safe, and its serialized form does not
depend on a size read before the entries. Where the private PySpark hooks it needs are missing (a
Spark Connect session, another PySpark release), it falls back to the public call and logs why.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

_DATA_SOURCE_CLASS = (
    "org.apache.spark.sql.execution.datasources.v2.python.UserDefinedPythonDataSource"
)


def register_data_source(spark: Any, source: type) -> None:
    """Register the data source class `source` with `spark`, safe for concurrent queries."""
    try:
        wrapped = _wrap_with_concurrent_env(spark, source)
    except (AttributeError, ImportError, NotImplementedError, TypeError) as exc:
        log.warning(
            "registering %s with the public API (%s); queries started at the same time may hit "
            "Spark's unsynchronized data source environment",
            source.name(),  # type: ignore[attr-defined]
            exc,
        )
        spark.dataSource.register(source)
        return
    jvm = spark.sparkContext._jvm
    data_source = getattr(jvm, _DATA_SOURCE_CLASS)(wrapped)
    spark._jsparkSession.dataSource().registerPython(source.name(), data_source)  # type: ignore[attr-defined]


def _wrap_with_concurrent_env(spark: Any, source: type) -> Any:
    """The JVM `SimplePythonFunction` for `source`, as PySpark builds it, on a concurrent map."""
    from pyspark.core.rdd import _prepare_for_python_RDD  # noqa: PLC0415 - optional dependency

    sc = spark.sparkContext
    jvm = sc._jvm
    pickled, broadcast_vars, env, includes = _prepare_for_python_RDD(sc, source)
    concurrent_env = jvm.java.util.concurrent.ConcurrentHashMap(env)
    return jvm.SimplePythonFunction(
        bytearray(pickled),
        concurrent_env,
        includes,
        sc.pythonExec,
        sc.pythonVer,
        broadcast_vars,
        sc._javaAccumulator,
    )
