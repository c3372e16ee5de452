"""The character-level recurrent model of FedJAX / TFF / LEAF for federated Shakespeare."""

from __future__ import annotations

import flax.linen as nn
import jax

from fedjax_lab.models.staged import StagedModel


class CharRNN(StagedModel):
    """Embedding (8) -> two LSTM layers (256) -> dense over the vocabulary, applied at every position:
    ``[B, T] int -> [B, T, vocab_size]`` logits. Stages ``embed, lstm1, lstm2``."""

    vocab_size: int = 90
    embed_dim: int = 8
    hidden: int = 256

    @property
    def stages(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("embed", "lstm1", "lstm2")

    def setup(self):
        self.embed = nn.Embed(self.vocab_size, self.embed_dim)
        self.lstm1 = nn.RNN(nn.OptimizedLSTMCell(self.hidden))
        self.lstm2 = nn.RNN(nn.OptimizedLSTMCell(self.hidden))
        self.output = nn.Dense(self.vocab_size)

    def stage(self, name, h, train, mask):
        return getattr(self, name)(h)

    def head(self, h: jax.Array) -> jax.Array:
        return self.output(h)
