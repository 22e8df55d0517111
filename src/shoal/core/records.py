"""Record classes: dataclasses in all but the cost of defining them.

``@dataclass(frozen=True, slots=True)`` writes each class's ``__init__``, ``__repr__``,
``__eq__``, ``__hash__``, ``__setattr__`` and ``__delattr__`` as source text and compiles
them one by one when its module is imported: about 0.7 ms a class on this machine's
Python, paid again by every new process (a DataLoader worker, a pandas script, each CLI
call) before its first byte. :func:`record` gives the same class -- same fields,
defaults, ``field(default_factory=..., repr=False)``, frozen (``FrozenInstanceError``),
slots, equality, hashing, ``repr``, pickling, ``dataclasses.fields`` / ``replace`` /
``asdict`` -- with the methods shared by all records (compiled once, into this module's
``.pyc``) except ``__init__``, which is compiled on the first instantiation of each
class, so a process pays only for the records it builds.

``@record(slots=False)`` keeps the instances' ``__dict__`` and the defaults as class
attributes, as ``@dataclass(frozen=True)`` does; ``frozen=False`` makes a mutable one
(unhashable, as ``@dataclass`` makes it). A ``__post_init__`` runs after the
fields are set. For classes of fields and class constants (no inherited fields, no
keyword-only fields, no ``InitVar``); anything more wants ``dataclasses.dataclass``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from operator import attrgetter
from typing import Any, TypeVar, dataclass_transform, overload

T = TypeVar("T")

#: what ``dataclasses.fields`` takes for a field (ClassVars and InitVars are others)
_FIELD_KIND = dataclasses._FIELD  # type: ignore[attr-defined]


def _names(obj: Any) -> tuple[str, ...]:
    return tuple(type(obj).__dataclass_fields__)


class _Record:
    """The methods every record shares: a record is the tuple of its fields."""

    __slots__ = ()
    #: its fields' values as a tuple (attrgetter: C speed)
    _values: Callable[[Any], tuple[Any, ...]]
    #: the fields ``repr`` shows
    _shown: tuple[str, ...]

    def __repr__(self) -> str:
        shown = ", ".join(f"{n}={getattr(self, n)!r}" for n in self._shown)
        return f"{type(self).__qualname__}({shown})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return self._values(self) == self._values(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._values(self))

    def __setattr__(self, name: str, value: object) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")

    def __getstate__(self) -> tuple[Any, ...]:
        return self._values(self)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        for name, value in zip(_names(self), state, strict=True):
            object.__setattr__(self, name, value)


def _values_of(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    if len(names) > 1:
        return attrgetter(*names)
    if names:
        one = attrgetter(names[0])
        return lambda o: (one(o),)
    return lambda o: ()


def _first_init(self: Any, *args: Any, **kwargs: Any) -> None:
    """Compile the real ``__init__`` of this record class, install it, and run it."""
    cls = type(self)
    fields: dict[str, dataclasses.Field[Any]] = cls.__dataclass_fields__
    params, body = ["self"], []
    env: dict[str, Any] = {"_set": object.__setattr__}
    for name, f in fields.items():
        if f.default is not dataclasses.MISSING:
            env[f"_d_{name}"] = f.default
            params.append(f"{name}=_d_{name}")
            body.append(f"_set(self, {name!r}, {name})")
        elif f.default_factory is not dataclasses.MISSING:
            env[f"_f_{name}"] = f.default_factory
            params.append(f"{name}=_MISSING")
            body.append(f"_set(self, {name!r}, _f_{name}() if {name} is _MISSING else {name})")
            env["_MISSING"] = dataclasses.MISSING
        else:
            params.append(name)
            body.append(f"_set(self, {name!r}, {name})")
    if hasattr(cls, "__post_init__"):
        body.append("self.__post_init__()")
    src = f"def __init__({', '.join(params)}):\n    " + ("\n    ".join(body) or "pass")
    exec(src, env)  # our own field names, checked identifiers
    init = env["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    type.__setattr__(cls, "__init__", init)
    init(self, *args, **kwargs)


@overload
@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
def record(cls: type[T], /) -> type[T]: ...


@overload
def record(*, slots: bool = True, frozen: bool = True) -> Callable[[type[T]], type[T]]: ...


def record(cls: type[T] | None = None, /, *, slots: bool = True, frozen: bool = True) -> Any:
    """The class, made a record of its annotated fields (see the module)."""
    if cls is None:
        return lambda c: _make(c, slots, frozen)
    return _make(cls, slots, frozen)


def _make(cls: type[T], slots: bool, frozen: bool) -> type[T]:
    ns = dict(cls.__dict__)
    annotations: dict[str, Any] = ns.get("__annotations__", {})
    fields: dict[str, dataclasses.Field[Any]] = {}
    for name, kind in annotations.items():
        if str(kind).startswith(("ClassVar", "typing.ClassVar")):
            continue
        if not name.isidentifier() or name.startswith("_"):
            raise TypeError(f"record {cls.__name__}: field name {name!r} is not allowed")
        default = ns.pop(name, dataclasses.MISSING)
        f: Any = (
            default
            if isinstance(default, dataclasses.Field)
            else dataclasses.field(default=default)
        )
        has_default = f.default is not dataclasses.MISSING
        if not _has_default(f) and any(_has_default(g) for g in fields.values()):
            raise TypeError(f"record {cls.__name__}: non-default field {name!r} after defaults")
        if has_default and not slots:
            ns[name] = f.default  # a class attribute, as dataclass leaves it
        f.name, f.type = name, kind
        f._field_type = _FIELD_KIND  # what dataclasses.fields() lists
        fields[name] = f
    for base in cls.__mro__[1:]:
        if getattr(base, "__dataclass_fields__", None):
            raise TypeError(f"record {cls.__name__}: fields inherited from {base.__name__}")
    names = tuple(fields)
    # the old class's descriptors: the new class makes its own (or none, with slots)
    ns.pop("__dict__", None)
    ns.pop("__weakref__", None)
    if slots:
        ns["__slots__"] = names
    ns["__match_args__"] = names
    ns["__dataclass_fields__"] = fields
    ns["_values"] = staticmethod(_values_of(names))
    ns["_shown"] = tuple(n for n, f in fields.items() if f.repr)
    shared = ("__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__")
    for method in shared if frozen else shared[:2]:
        if ns.get(method) is None:
            ns[method] = getattr(_Record, method)
    if not frozen:
        ns["__hash__"] = None  # mutable and compared by value: unhashable, as dataclass
    if slots:
        ns.setdefault("__getstate__", _Record.__getstate__)
        ns.setdefault("__setstate__", _Record.__setstate__)
    ns.setdefault("__init__", _first_init)
    meta: Any = type(cls)
    out: type[T] = meta(cls.__name__, cls.__bases__, ns)
    return out


def _has_default(f: dataclasses.Field[Any]) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
