"""What runs servers: the broker (`broker`), the Kafka endpoint (`kafka`) and the connector
endpoint (`connector`), and the processes that assemble them. Query processes never import
this package (tests/test_import_contracts.py); the coordinator, the executor and the CLI do.

    _endpoints.py        BrokerEndpoints: a broker's optional connector endpoint and Kafka
                         listener
    _broker_main.py      run_broker: a standalone broker in the foreground (`tq broker`)
    _kafka_main.py       serve_local / run_kafka: a data dir behind a broker with only its
                         Kafka listener (`tq kafka`)
    _metrics.py          ProcessMetrics: a process's metrics in Prometheus' text format
    _connector_main.py   a broker with only its connector endpoint
                         (`python -m querylib.server.connector`)
    console/             the web console (`tq up`, `tq coordinator`)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from querylib._lazy import lazy_exports

if TYPE_CHECKING:
    from ._broker_main import run_broker
    from ._connector_main import run_connector_broker, serve_connector_broker
    from ._endpoints import BrokerEndpoints, EndpointUnavailableError
    from ._kafka_main import run_kafka, serve_local
    from ._metrics import (
        MetricsUnavailableError,
        ProcessMetrics,
        RemoteMetrics,
        broker_families,
        rpc_families,
        serve_metrics,
    )

if not TYPE_CHECKING:  # a type checker reads the imports above, not this
    __getattr__, __dir__, __all__ = lazy_exports(__name__, globals())
