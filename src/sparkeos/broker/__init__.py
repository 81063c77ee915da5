"""sparkeos' embedded single-node Kafka-protocol broker."""

from .core import Broker, BrokerConfig
from .embedded import BrokerProcess, EmbeddedBroker

__all__ = ["Broker", "BrokerConfig", "BrokerProcess", "EmbeddedBroker"]
