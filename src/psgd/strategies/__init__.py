"""Parallel-SGD strategies beyond Lightning's DDP, registered so that `Trainer(strategy=<name>)` works."""

from pytorch_lightning.strategies import StrategyRegistry

from psgd.strategies.elastic_averaging import ElasticAveragingStrategy
from psgd.strategies.hogwild import HogwildStrategy
from psgd.strategies.model_averaging import ModelAveragingStrategy

for _strategy in (ModelAveragingStrategy, ElasticAveragingStrategy, HogwildStrategy):
    if _strategy.strategy_name not in StrategyRegistry:
        _strategy.register_strategies(StrategyRegistry)

__all__ = ["ElasticAveragingStrategy", "HogwildStrategy", "ModelAveragingStrategy"]
