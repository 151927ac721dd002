"""The key/value cache of a decoder: what every layer computed for the positions seen so far.

Dimension letters: ``B`` batch, ``K`` key/value heads, ``S`` cached length, ``D`` head dim.
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from .._checks import check_positive_int

__all__ = ["KVCache"]


class KVCache:
    """Per-layer keys and values ``[B, K, S, D]``, appended to by each cached forward.

    Storage is allocated once for ``capacity`` positions when that is known (as in
    ``generate``) and doubled when it runs out, so a step writes only its own positions
    instead of copying the whole cache.

    Args:
        num_layers: how many attention layers write into it.
        capacity: positions to allocate room for on the first write (``None``: as many as
            the first write brings, then doubling).

    Example:
        >>> cache = KVCache(num_layers=2)
        >>> out = model(prompt_ids, past_key_values=cache, use_cache=True)
        >>> out = model(next_ids, past_key_values=cache, use_cache=True)  # attends to the prompt too
    """

    def __init__(self, num_layers: int, capacity: Optional[int] = None) -> None:
        check_positive_int("num_layers", num_layers)
        if capacity is not None:
            check_positive_int("capacity", capacity)
        self.capacity = capacity
        self._keys: list[Optional[Tensor]] = [None] * num_layers
        self._values: list[Optional[Tensor]] = [None] * num_layers
        self._lengths = [0] * num_layers

    @property
    def num_layers(self) -> int:
        return len(self._keys)

    def __len__(self) -> int:
        """Positions cached (by the first layer: the length before a forward starts)."""
        return self._lengths[0]

    def update(self, layer: int, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Append ``key``/``value`` ``[B, K, T, D]`` to ``layer``'s cache; return all of it ``[B, K, S, D]``."""
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer must be in [0, {self.num_layers}), got {layer}")
        length, added = self._lengths[layer], key.shape[2]
        stored = self._keys[layer]
        if stored is not None and (stored.shape[:2] != key.shape[:2] or stored.shape[3] != key.shape[3]):
            raise ValueError(
                f"the cache holds [B, K, S, D] = {tuple(stored.shape[:2])} x {stored.shape[3]}; got keys "
                f"{tuple(key.shape)}: use one cache per batch"
            )
        if stored is None or length + added > stored.shape[2]:
            room = max(length + added, self.capacity or 0, 2 * (0 if stored is None else stored.shape[2]))
            self._keys[layer] = self._grow(stored, key, room, length)
            self._values[layer] = self._grow(self._values[layer], value, room, length)
        self._keys[layer][:, :, length:length + added] = key
        self._values[layer][:, :, length:length + added] = value
        self._lengths[layer] = length + added
        end = length + added
        return self._keys[layer][:, :, :end], self._values[layer][:, :, :end]  # [B, K, S, D]

    @staticmethod
    def _grow(stored: Optional[Tensor], new: Tensor, room: int, length: int) -> Tensor:
        B, K, _, D = new.shape
        grown = new.new_empty(B, K, room, D)  # [B, K, room, D]
        if stored is not None and length:
            grown[:, :, :length] = stored[:, :, :length]
        return grown

    def layer(self, layer: int) -> tuple[Optional[Tensor], Optional[Tensor]]:
        """``layer``'s cached keys and values ``[B, K, S, D]`` (``None`` before the first write)."""
        keys = self._keys[layer]
        if keys is None:
            return None, None
        end = self._lengths[layer]
        return keys[:, :, :end], self._values[layer][:, :, :end]

    def storage(self, layer: int) -> tuple[Tensor, Tensor]:
        """``layer``'s whole allocated keys and values ``[B, K, capacity, D]``, cached or not
        (for code that writes the next slots itself)."""
        keys = self._keys[layer]
        if keys is None:
            raise ValueError(f"layer {layer} of the cache has no storage yet: run a forward pass with it first")
        return keys, self._values[layer]

    def memory_bytes(self) -> int:
        """Bytes held by the allocated storage."""
        return sum(t.numel() * t.element_size() for t in (*self._keys, *self._values) if t is not None)

    def __repr__(self) -> str:
        return f"KVCache(layers={self.num_layers}, length={len(self)})"
