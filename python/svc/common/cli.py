"""Command-line options made from a settings class, so each default is written once.

``settings_command`` turns the fields of ``ComponentSettings`` classes into Typer options of a
command and hands the command the settings objects built from them:

* a field ``max_body_bytes`` is the option ``--max-body-bytes`` (or the name given in
  ``Options.names``; a boolean is a ``--name/--no-name`` flag unless named otherwise);
* its help is the field's docstring, its environment variable the settings class's
  (``ComponentSettings.env_name``; shown as ``[env var: ...]``), its default the field's
  (shown as ``[default: ...]``), its bounds the field's ``ge``/``le``;
* a field without a default is a required option (its environment variable may give it).

Precedence: an option given on the command line, else its environment variable, else the
field's default (Click resolves the option in that order; https://click.palletsprojects.com/
en/stable/options/#values-from-environment-variables). An option whose value is None (no
default, nothing given) reaches the settings class as nothing at all, so the class applies
its own default (a factory's, or a check that needs the whole class such as ``auth``). The
settings class validates every value; one that refuses what it got (pydantic's
``ValidationError``) ends the command with exit code 2 and one line naming every bad setting.
Typer reads options from the signature (https://typer.tiangolo.com/tutorial/options/), which
the decorator writes.
"""

from __future__ import annotations

import inspect
import re
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

import annotated_types
import typer
from pydantic import SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from svc.common.settings import ComponentSettings

__all__ = [
    "Options",
    "describe_validation_error",
    "option_for",
    "run_migration",
    "settings_command",
]


@dataclass(frozen=True)
class Options:
    """Which fields of a settings class are options of a command, and their names.

    Attributes:
        model: the settings class (a ``ComponentSettings``).
        only: the fields to offer, in this order (None: every field, in the class's order).
        exclude: fields not to offer.
        names: option names by field (``{"kafka_url": "--kafka"}``); default ``--kebab-name``.

    """

    model: type[ComponentSettings]
    only: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()
    names: Mapping[str, str] = field(default_factory=dict)

    def fields(self) -> list[tuple[str, FieldInfo]]:
        """The offered fields as ``(name, FieldInfo)``, in order.

        Raises:
            KeyError: ``only`` names a field the class does not have.

        """
        all_fields = self.model.model_fields
        names = self.only if self.only is not None else tuple(all_fields)
        return [(n, all_fields[n]) for n in names if n not in self.exclude]


def describe_validation_error(e: ValidationError) -> str:
    """A pydantic ``ValidationError`` as one line: ``field: message; ...``.

    Args:
        e: the error of a settings class.

    Returns:
        Each error as ``<field path>: <message>`` (``settings`` for a check of the whole
        class), joined by ``; ``.

    """
    return "; ".join(
        f"{'.'.join(map(str, err['loc'])) or 'settings'}: {err['msg']}" for err in e.errors()
    )


def _help(info: FieldInfo) -> str | None:
    """A field's description as one line of help (reStructuredText's double backquotes gone)."""
    if not info.description:
        return None
    return re.sub(r"\s+", " ", info.description.replace("``", "")).strip()


def _cli_type(annotation: Any) -> tuple[Any, bool]:
    """The Typer type of a field's annotation, and whether the field may be None.

    Literals, lists and mappings become text (the settings class parses and checks them: a
    list as a JSON list or comma-separated text, ``svc.common.settings.list_setting``; a
    mapping as its field's validator says, ``auth_roles`` a JSON object or ``key=value``
    pairs).

    Raises:
        TypeError: a type no option can carry (a model, a union of several types).

    """
    origin = get_origin(annotation)
    if origin is Annotated:
        return _cli_type(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"no command-line option for a union of {args}")
        return _cli_type(args[0])[0], True
    if origin in (Literal, list, dict) or annotation is SecretStr:
        return str, False
    if annotation in (str, int, float, bool, Path) or (
        isinstance(annotation, type) and issubclass(annotation, Enum)
    ):
        return annotation, False
    raise TypeError(f"no command-line option for a setting of type {annotation!r}")


def _typer_default(info: FieldInfo) -> Any:
    """The option's default: the field's.

    None for a default made by a factory (the settings class makes it); none at all (a
    required option) for a field without one.
    """
    if info.default is PydanticUndefined:
        return None if info.default_factory is not None else inspect.Parameter.empty
    return info.default


def option_for(model: type[ComponentSettings], name: str, decl: str | None = None) -> Any:
    """The Typer annotation of one settings field: ``Annotated[T | None, typer.Option(...)]``.

    Args:
        model: the settings class.
        name: the field.
        decl: the option's name (default: Typer's, ``--kebab-name`` and for a boolean
            ``--name/--no-name``).

    Returns:
        The annotation for a parameter named `name` (module docs say what it carries).

    Raises:
        TypeError: the field's type cannot be an option.

    """
    info = model.model_fields[name]
    cli_type, _ = _cli_type(info.annotation)
    bounds: dict[str, Any] = {}
    for m in info.metadata:
        if isinstance(m, annotated_types.Ge):
            bounds["min"] = m.ge
        elif isinstance(m, annotated_types.Le):
            bounds["max"] = m.le
    option = typer.Option(
        *((decl,) if decl else ()),
        envvar=model.env_name(name),
        show_envvar=True,
        help=_help(info),
        **bounds,
    )
    return Annotated[cli_type | None, option]


def settings_command(prog: str, **groups: Options) -> Callable[[Callable[..., Any]], Any]:
    """A decorator giving a Typer command the options of settings classes (module docs).

    The command declares one parameter per group, typed with the group's settings class; the
    decorator puts the options of the group's fields in that parameter's place, and calls the
    command with the settings objects built from them (every parameter keyword-only).

    Args:
        prog: the command's name in error messages (``svc pdp``).
        groups: per parameter name, the settings class and which of its fields are options.

    Returns:
        The decorator; the decorated function is what ``app.command()`` registers.

    Raises:
        TypeError: a field cannot be an option, or two parameters would have the same name.

    """

    def decorate(fn: Callable[..., Any]) -> Any:
        hints = get_type_hints(fn, include_extras=True)
        params: list[inspect.Parameter] = []
        owners: dict[str, tuple[str, str]] = {}  # parameter -> (group, field)
        for p in inspect.signature(fn).parameters.values():
            opts = groups.get(p.name)
            if opts is None:
                params.append(
                    p.replace(
                        kind=inspect.Parameter.KEYWORD_ONLY,
                        annotation=hints.get(p.name, p.annotation),
                    )
                )
                continue
            for name, info in opts.fields():
                owners[name] = (p.name, name)
                params.append(
                    inspect.Parameter(
                        name,
                        inspect.Parameter.KEYWORD_ONLY,
                        annotation=option_for(opts.model, name, opts.names.get(name)),
                        default=_typer_default(info),
                    )
                )
        names = [p.name for p in params]
        if len(set(names)) != len(names):
            raise TypeError(f"{prog}: two parameters have the same name in {names}")

        def command(**kwargs: Any) -> Any:
            given: dict[str, dict[str, Any]] = {g: {} for g in groups}
            for param, (group, name) in owners.items():
                value = kwargs.pop(param)
                if value is not None:
                    given[group][name] = value
            built: dict[str, ComponentSettings] = {}
            for group, opts in groups.items():
                try:
                    built[group] = opts.model(**given[group])
                except ValidationError as e:
                    typer.echo(f"{prog}: bad settings: {describe_validation_error(e)}", err=True)
                    raise typer.Exit(code=2) from e
            return fn(**kwargs, **built)

        command.__name__ = fn.__name__
        command.__qualname__ = fn.__qualname__
        command.__doc__ = fn.__doc__
        command.__module__ = fn.__module__
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate


def run_migration(prog: str, schema: str, database_url: str, migrate: Callable[[Any], str]) -> None:
    """The body of ``svc <service> migrate``: applies a relational service's schema.

    Prints the revision. It is the schema job a release runs before its replicas
    (docs/deploy.md).

    Args:
        prog: the command, for messages (``svc policy migrate``).
        schema: the schema's name in the output (``policy``: "policy schema at revision R").
        database_url: the SQLAlchemy URL of the service's database.
        migrate: the service's Alembic upgrade (``svc.<service>.migrate.migrate``), taking a
            SQLAlchemy engine and returning the revision it left the database at.

    Raises:
        typer.Exit: code 2 when the database refuses (the error's class and text on stderr).

    """
    from sqlalchemy import create_engine
    from sqlalchemy.exc import SQLAlchemyError

    engine = create_engine(database_url)
    try:
        typer.echo(f"{schema} schema at revision {migrate(engine)}")
    except SQLAlchemyError as e:
        typer.echo(f"{prog}: {e.__class__.__name__}: {e}", err=True)
        raise typer.Exit(code=2) from e
    finally:
        engine.dispose()
