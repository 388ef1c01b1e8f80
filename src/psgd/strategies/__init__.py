"""Parallel-SGD strategies beyond Lightning's DDP, registered so that `Trainer(strategy=<name>)` works."""

from pytorch_lightning.strategies import StrategyRegistry

from psgd.strategies.model_averaging import ModelAveragingStrategy

if ModelAveragingStrategy.strategy_name not in StrategyRegistry:
    ModelAveragingStrategy.register_strategies(StrategyRegistry)

__all__ = ["ModelAveragingStrategy"]
