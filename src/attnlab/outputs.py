"""What attnlab's models return: one output contract for every model.

Every model output is a :class:`ModelOutput`, which behaves like HuggingFace's
``ModelOutput`` and like the article's tuples at once:

* attribute access: ``out.logits``, ``out.attentions``;
* key access: ``out["logits"]`` (a ``KeyError`` for a field that is ``None``, as in
  HuggingFace), ``"logits" in out``, ``out.keys()`` / ``out.items()`` (fields that are set);
* index access and unpacking: ``out[0]``, ``x, attentions = encoder(ids)``, and
  ``out.to_tuple()``. The tuple holds the fields in declared order, skipping those that
  are ``None`` (so ``out[0]`` is the loss when labels were given, else the logits, as in
  HuggingFace), except fields a class always keeps in its tuple: an encoder always
  unpacks as ``x, attentions`` (the article's pair), ``attentions`` ``None`` unless asked.

Per-layer attention weights are a :class:`LayerAttentions`: a tuple of ``[B, H, T, S]``
tensors, layer 1 first (``attentions[0]``, ``attentions[-1]``, ``torch.stack(attentions)``
and iteration work as on HuggingFace's tuple), that also answers to the article's names
(``attentions["layer_1"]``, ``"layer_1" in attentions``, ``attentions.items()``).
Python indices are 0-based; names and everything printed for people count layers and
heads from 1.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Iterable, Iterator, Optional, Sequence, Union

from torch import Tensor

__all__ = ["LayerAttentions", "ModelOutput", "layer_name"]


def layer_name(index: int) -> str:
    """The name of the layer at 0-based ``index``: ``layer_1`` for index 0."""
    return f"layer_{index + 1}"


class LayerAttentions(tuple):
    """Per-layer attention weights: a tuple (layer 1 first) that also takes layer names.

    Example:
        >>> attentions = LayerAttentions([torch.zeros(1, 2, 3, 3), torch.ones(1, 2, 3, 3)])
        >>> attentions[0] is attentions["layer_1"], attentions[-1] is attentions["layer_2"]
        (True, True)
        >>> list(attentions.keys())
        ['layer_1', 'layer_2']
    """

    _names: tuple[str, ...]

    def __new__(cls, layers: Iterable[Optional[Tensor]] = (), names: Optional[Sequence[str]] = None):
        instance = super().__new__(cls, layers)
        names = tuple(layer_name(i) for i in range(len(instance))) if names is None else tuple(names)
        if len(names) != len(instance):
            raise ValueError(f"names has {len(names)} entries for {len(instance)} layers")
        instance._names = names
        return instance

    def _index_of(self, name: str) -> int:
        try:
            return self._names.index(name)
        except ValueError:
            raise KeyError(f"no layer named {name!r}; the layers are {', '.join(self._names)}") from None

    def __getitem__(self, key: Union[int, slice, str]) -> Any:
        if isinstance(key, str):
            return super().__getitem__(self._index_of(key))
        if isinstance(key, slice):
            return LayerAttentions(super().__getitem__(key), names=self._names[key])
        if isinstance(key, Tensor) or not hasattr(key, "__index__"):
            raise TypeError(
                f"layer attentions are indexed by position (0 = layer 1) or name ('layer_1'), got "
                f"{type(key).__name__}; iterating gives the tensors, as HuggingFace's tuple does: "
                f"use .keys() or .items() for the names"
            )
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            return key in self._names
        return any(key is layer for layer in self)

    def __reduce__(self):
        return (LayerAttentions, (tuple(self), self._names))

    def keys(self) -> tuple[str, ...]:
        """The layer names, ``layer_1`` first."""
        return self._names

    def values(self) -> tuple[Optional[Tensor], ...]:
        return tuple(self)

    def items(self) -> Iterator[tuple[str, Optional[Tensor]]]:
        return iter(zip(self._names, self))

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self._names else default

    def __repr__(self) -> str:
        shapes = ", ".join(
            f"{name}: {None if layer is None else list(layer.shape)}" for name, layer in self.items()
        )
        return f"LayerAttentions({shapes})"


class ModelOutput:
    """Base of every attnlab output; subclasses are ``@dataclass(eq=False)``.

    Subclasses list in ``_always_in_tuple`` the fields that stay in the tuple view
    even when ``None`` (to keep a fixed unpacking such as the article's ``x, attn``), or
    in ``_tuple_fields`` the exact fields of the tuple view, when it is a fixed pair
    that leaves fields out (the article's ``output, weights``).
    """

    _always_in_tuple: ClassVar[tuple[str, ...]] = ()
    _tuple_fields: ClassVar[Optional[tuple[str, ...]]] = None

    def _names(self) -> list[str]:
        return [field.name for field in dataclasses.fields(self)]

    def keys(self) -> list[str]:
        """Names of the fields that are set (not ``None``), in declared order."""
        return [name for name in self._names() if getattr(self, name) is not None]

    def values(self) -> list[Any]:
        return [getattr(self, name) for name in self.keys()]

    def items(self) -> list[tuple[str, Any]]:
        return [(name, getattr(self, name)) for name in self.keys()]

    def to_tuple(self) -> tuple[Any, ...]:
        """The fields in declared order, without those that are ``None`` (see the class)."""
        if self._tuple_fields is not None:
            return tuple(getattr(self, name) for name in self._tuple_fields)
        return tuple(
            getattr(self, name)
            for name in self._names()
            if getattr(self, name) is not None or name in self._always_in_tuple
        )

    def __getitem__(self, key: Union[int, slice, str]) -> Any:
        if isinstance(key, str):
            if key not in self._names():
                raise KeyError(f"{type(self).__name__} has no field {key!r}; its fields are {self._names()}")
            value = getattr(self, key)
            if value is None:
                raise KeyError(f"{key!r} is not set in this {type(self).__name__} (it is None)")
            return value
        return self.to_tuple()[key]

    def get(self, key: str, default: Any = None) -> Any:
        value = getattr(self, key, None) if key in self._names() else None
        return default if value is None else value

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in self.keys()

    def __iter__(self) -> Iterator[Any]:
        return iter(self.to_tuple())

    def __len__(self) -> int:
        return len(self.to_tuple())
