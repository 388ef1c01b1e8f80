"""The parallel-SGD algorithms, one per file (ddp.py and its compression.py, model_averaging.py,
elastic_averaging.py, decentralized.py, hogwild.py), and what every strategy declares to the run: the contract
(contract.py) and psgd's strategies' config classes (configs.py), which build the algorithms. Importing the
package loads no torch; `import psgd.strategies.registry` registers the algorithms with Lightning under their
names."""
