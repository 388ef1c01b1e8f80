"""psgd's strategies as Lightning knows them: importing this module registers each under its name, so that
`Trainer(strategy="model_averaging")` (or diloco, elastic_averaging, decentralized, hogwild; ddp is Lightning's
own) works with a LightningModule of a user's own."""

from pytorch_lightning.strategies import StrategyRegistry

from psgd.strategies.decentralized import DecentralizedStrategy
from psgd.strategies.elastic_averaging import ElasticAveragingStrategy
from psgd.strategies.hogwild import HogwildStrategy
from psgd.strategies.model_averaging import ModelAveragingStrategy

for _strategy in (ModelAveragingStrategy, ElasticAveragingStrategy, DecentralizedStrategy, HogwildStrategy):
    if _strategy.strategy_name not in StrategyRegistry:
        _strategy.register_strategies(StrategyRegistry)
