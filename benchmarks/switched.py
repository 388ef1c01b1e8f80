"""psgd's run timed in chunks beside the minimal loop, with what each chunk runs switched before it
(grad_lifetime.py: psgd's zeroing or Lightning's; plumbing.py: psgd's step, Lightning's precision
plugin or the raw step)."""

import time

import compare
import pytorch_lightning as L


class SwitchedChunks(L.Callback):
    """psgd's run from epoch 1 on (epoch 0 is warm-up) in chunks of `chunk` steps, each followed by as many
    minimal-loop steps (compare.VanillaSide) in the same process and thread, as in compare.py's paired
    overhead. `set_up(trainer, module)` runs once, at epoch 1's start; before each chunk,
    `switch(trainer, module, batch_idx)` sets up what the chunk runs (Lightning reads the module's and the
    strategy's attributes at every step) and returns its label. `rows` keeps (label, psgd seconds,
    minimal-loop seconds) per timed chunk, in order; an epoch's last chunk is timed only when the next
    epoch's first starts, so a chunk the epoch's end cut short is not."""

    def __init__(self, cfg, chunk: int):
        self.cfg, self.chunk = cfg, chunk
        self.rows: list[tuple] = []
        self.label = None

    def set_up(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        pass

    def switch(self, trainer: L.Trainer, module: L.LightningModule, batch_idx: int):
        raise NotImplementedError

    def on_train_epoch_start(self, trainer, module):
        self.on = trainer.current_epoch >= 1
        self.start, self.vanilla_s = None, 0.0
        if trainer.current_epoch == 1:
            self.side = compare.VanillaSide(self.cfg, module, trainer.datamodule)
            self.set_up(trainer, module)

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if self.on and batch_idx % self.chunk == 0:
            now = time.perf_counter()
            if self.start is not None:  # the chunk up to here, less the minimal loop's chunk in it
                self.rows.append((self.label, now - self.start - self.vanilla_s, self.vanilla_s))
            self.start = now
            self.label = self.switch(trainer, module, batch_idx)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if self.on and self.start is not None and (batch_idx + 1) % self.chunk == 0:
            start = time.perf_counter()
            for _ in range(self.chunk):
                self.side.step(*self.side.next_batch())
            self.vanilla_s = time.perf_counter() - start
