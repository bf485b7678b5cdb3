"""The generator's pure per-partition engine: events in, commands out (see partition.py)."""

from broker_ext.engine.partition import AwaitingCursor, Following, PartitionEngine, TakingOver, Unowned
from broker_ext.engine.vocabulary import EngineConfig

__all__ = ["AwaitingCursor", "EngineConfig", "Following", "PartitionEngine", "TakingOver", "Unowned"]
