"""The public surface of querylib.broker (the clients) and querylib.server.broker (the
broker): what __all__ promises exists, and nothing private leaks into it."""

import querylib.broker as broker
import querylib.server as server
import querylib.server.broker as broker_server


def test_all_names_exist_and_are_public():
    for name in broker.__all__:
        assert hasattr(broker, name), name
        assert not name.startswith("_")
    assert sorted(broker.__all__) == sorted(set(broker.__all__))


def test_the_clients_and_server_are_exported():
    for name in ["Producer", "Subscriber", "AsyncProducer", "AsyncSubscriber", "Data",
                 "Progress", "EndOfStream", "list_partitions"]:
        assert name in broker.__all__
    for name in ["BrokerServer", "BrokerState", "BrokerPort"]:
        assert name in broker_server.__all__ and name not in broker.__all__
    assert "run_broker" in server.__all__
    for package in (broker, broker_server, server):
        assert {n for n in vars(package) if not n.startswith("_")} <= \
            set(package.__all__) | {"broker", "kafka", "connector", "console", "messages"}
