"""The base of every stage's options model (``ConvertOptions``, ``CalibrationSettings``, ``QuantizeOptions``,
``ValidateOptions``, ``PublishOptions``, ``MigrateOptions``): a frozen pydantic model whose options are declared
once, as its fields, and reached by name.

:meth:`Options.of` builds one from flat keywords (the CLI's flags, a library function's keywords): each keyword goes
to the field of that name, or to the one nested options model that has it (``ConvertOptions.of(steps=5)`` sets
``calibration.steps``), so a composed model is filled without repeating its parts' option lists. A keyword no field
takes is a ``TypeError`` (as for a function); a value of the wrong type an :class:`~eagle_migrate.errors.InputError`
(exit 2) naming the option. :func:`choice` is a Literal field checked with the flag's own name.

:class:`RunOptions` holds the run-wide options (device, dtype, seed, k, engine, the vLLM interpreter) once; a stage's
model declares which of them it takes, and under which of its own names, in ``RUN_FIELDS`` beside its fields, and
:meth:`RunOptions.onto` lays them over it (``migrate`` gives every stage the run's values so).
Imports: pydantic, ``choices``, ``errors`` (layer 0: no torch).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Optional, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError

from .choices import Device, Dtype, values
from .errors import InputError


def check_choice(literal: Any, flag: str, value: Any) -> Any:
    """``value`` (an Enum's string taken) when it is one of ``literal``'s values or None; else an InputError naming
    ``flag`` and the allowed values. The one check of a closed option (:func:`choice` fields call it)."""
    allowed = values(literal)
    v = getattr(value, "value", value)  # an Enum carries its string in .value
    if v is not None and v not in allowed:
        raise InputError(f"{flag} {v!r}: expected one of {', '.join(allowed)}", f"pass {flag} {allowed[0]} (see --help)")
    return v


def choice(literal: Any, flag: str) -> Any:
    """``literal`` as a field type whose wrong value is an InputError naming ``flag`` and the allowed values
    (:func:`check_choice`, before pydantic's own check)."""
    return Annotated[literal, BeforeValidator(lambda v: check_choice(literal, flag, v))]


def _options_type(annotation: Any) -> type[Options] | None:
    """The options model a field holds (``X`` or ``X | None``), or None."""
    cands = [annotation, *get_args(annotation)] if get_origin(annotation) is not None else [annotation]
    for c in cands:
        if isinstance(c, type) and issubclass(c, Options):
            return c
    return None


class Options(BaseModel):
    """A stage's options: frozen, unknown keywords refused, each option one field."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    #: a flat keyword that several nested models take, and the one it goes to (a composed model settles it here)
    ROUTES: ClassVar[dict[str, str]] = {}
    #: the run-wide options (:class:`RunOptions`' fields) this stage takes, each under the flat keyword that sets it
    #: here (``{"num_speculative_tokens": "k"}``); :meth:`RunOptions.onto` lays them over
    RUN_FIELDS: ClassVar[dict[str, str]] = {}
    #: the version of the model's meaning: raised when a field changes what it does (not when one is added with a
    #: default that keeps the old behaviour), so a dump of the old meaning is never read as the new one
    VERSION: ClassVar[int] = 1

    @classmethod
    def nested(cls) -> dict[str, type[Options]]:
        """The fields that hold another options model (composition), by name."""
        out = {}
        for name, f in cls.model_fields.items():
            t = _options_type(f.annotation)
            if t is not None:
                out[name] = t
        return out

    @classmethod
    def route(cls, key: str) -> list[str] | None:
        """The path of fields a flat keyword ``key`` sets (``["calibration", "steps"]``), or None when no field of
        this model or of a nested one takes it. A field of this model wins over a nested one's; two nested models
        both taking it is a TypeError (the keyword would be ambiguous)."""
        nested = cls.nested()
        if key in cls.model_fields and key not in nested:
            return [key]
        if key in cls.ROUTES:
            name = cls.ROUTES[key]
            return [name, *nested[name].route(key)]
        found = [(name, r) for name, t in nested.items() if (r := t.route(key)) is not None]
        if len(found) > 1:
            raise TypeError(f"{cls.__name__}: option {key!r} is ambiguous ({', '.join(n for n, _ in found)})")
        return [found[0][0], *found[0][1]] if found else None

    @classmethod
    def fields_flat(cls) -> set[str]:
        """Every flat keyword :meth:`of` takes: this model's own fields and, through composition, its parts' (a
        keyword two parts take, unsettled by :attr:`ROUTES`, is not one of them)."""
        out = {n for n in cls.model_fields if n not in cls.nested()}
        for t in cls.nested().values():
            for k in t.fields_flat():
                try:
                    if cls.route(k) is not None:
                        out.add(k)
                except TypeError:  # ambiguous
                    pass
        return out

    @classmethod
    def of(cls, base: Options | None = None, /, **flat: Any):
        """``base`` (default: every default) with the flat keywords ``flat`` laid over it, each routed to its field
        (:meth:`route`); ``base`` itself when there is nothing to lay over."""
        if base is not None and not flat:
            return base
        own: dict[str, Any] = {}
        parts: dict[str, dict[str, Any]] = {}
        for key, value in flat.items():
            path = cls.route(key)
            if path is None:
                raise TypeError(f"{cls.__name__} has no option {key!r}")
            if len(path) == 1:
                own[key] = value
            else:
                parts.setdefault(path[0], {})[key] = value
        data = {n: getattr(base, n) for n in base.model_fields_set} if base is not None else {}
        data.update(own)
        nested = cls.nested()
        for name, sub in parts.items():
            cur = data.get(name) if name in data else (getattr(base, name) if base is not None else None)
            data[name] = nested[name].of(cur, **sub) if cur is not None else nested[name].of(**sub)
        return cls.build(**data)

    @classmethod
    def build(cls, **data: Any):
        """``cls(**data)`` with a wrong value as an InputError naming the option (pydantic's ValidationError
        otherwise); an unknown keyword is a TypeError."""
        unknown = [k for k in data if k not in cls.model_fields]
        if unknown:
            raise TypeError(f"{cls.__name__} has no option {unknown[0]!r}")
        try:
            return cls(**data)
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(x) for x in err.get("loc", ())) or cls.__name__
            raise InputError(f"{where} = {err.get('input')!r}: {err.get('msg')}") from None

    def to_dict(self) -> dict[str, Any]:
        """The versioned dump: ``{"type", "version", "options"}`` with the options that differ from the defaults (JSON
        values). What a resumable run hashes and records (the pipeline's stage inputs)."""
        return {"type": type(self).__name__, "version": self.VERSION,
                "options": self.model_dump(mode="json", exclude_defaults=True)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        """The model back from :meth:`to_dict`'s dump; an InputError for another model's dump or another version
        (its options may mean something else now)."""
        if data.get("type") != cls.__name__ or data.get("version") != cls.VERSION:
            raise InputError(f"options of {data.get('type')} version {data.get('version')}, not {cls.__name__} "
                             f"version {cls.VERSION}", "re-run with this version's options (the meaning changed)")
        return cls.build(**data.get("options", {}))

    def replace(self, **fields: Any):
        """A copy with ``fields`` (this model's own field names) replaced, checked again."""
        return type(self).of(self, **fields)



class RunOptions(Options):
    """The run-wide options, declared once: one value for every stage of a run that takes it (each stage's
    ``RUN_FIELDS`` says which, and under which name). ``vllm_python`` None: vLLM in this Python."""

    device: choice(Device, "--device") = "auto"
    dtype: choice(Dtype, "--dtype") = "auto"
    seed: int = 0
    num_speculative_tokens: int = 3  # -k
    engine: str = "auto"  # what serves the target (calibration's held-out set, validate): auto or a registered engine
    vllm_python: Optional[str] = None

    def onto(self, model: Options, **fields: Any) -> Options:
        """``model`` with every run-wide value it takes (its ``RUN_FIELDS``; a None value is "not given" and stays
        the model's own) and ``fields`` laid over, checked again: the stage's own options model, handed to it whole."""
        run = {flat: getattr(self, name) for name, flat in model.RUN_FIELDS.items() if getattr(self, name) is not None}
        return model.replace(**run, **fields)

    def set_on(self, model: Options) -> list[str]:
        """The run-wide options set on ``model`` itself (a stage's options inside a composed run), by ``model``'s
        own names: a run gives them once, so a stage's own value would be overruled."""
        out = []
        for flat in model.RUN_FIELDS.values():
            path, cur = type(model).route(flat) or [], model
            for i, name in enumerate(path):
                if name not in cur.model_fields_set:
                    break
                if i == len(path) - 1:
                    out.append(flat)
                cur = getattr(cur, name)
        return sorted(out)
