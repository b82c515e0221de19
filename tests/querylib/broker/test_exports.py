"""The public surface of querylib.broker: what __all__ promises exists, and nothing private
leaks into it."""

import querylib.broker as broker


def test_all_names_exist_and_are_public():
    for name in broker.__all__:
        assert hasattr(broker, name), name
        assert not name.startswith("_")
    assert sorted(broker.__all__) == sorted(set(broker.__all__))


def test_the_clients_and_server_are_exported():
    for name in ["Producer", "Subscriber", "AsyncProducer", "AsyncSubscriber", "BrokerServer",
                 "BrokerState", "Data", "Progress", "EndOfStream", "run_broker"]:
        assert name in broker.__all__
