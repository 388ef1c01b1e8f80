"""The parallel-SGD algorithms, one per file, each registered with Lightning under its name, so that
`Trainer(strategy="model_averaging")` (or diloco, elastic_averaging, hogwild; ddp is Lightning's) works once this
package is imported. Their config classes, which psgd's run builds them from, are in psgd.config.strategies."""

from pytorch_lightning.strategies import StrategyRegistry

from psgd.strategies.elastic_averaging import ElasticAveragingStrategy
from psgd.strategies.hogwild import HogwildStrategy
from psgd.strategies.model_averaging import ModelAveragingStrategy

for _strategy in (ModelAveragingStrategy, ElasticAveragingStrategy, HogwildStrategy):
    if _strategy.strategy_name not in StrategyRegistry:
        _strategy.register_strategies(StrategyRegistry)

__all__ = ["ElasticAveragingStrategy", "HogwildStrategy", "ModelAveragingStrategy"]
