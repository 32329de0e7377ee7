"""One JSON document per ``--json`` command, also when the command fails.

Every ``railhop`` command with a ``--json`` flag is a :class:`JsonCommand`: on success it prints
one document carrying ``"version": JSON_VERSION`` (built by :func:`document`); when it fails
(a usage error, a domain error, a finding raised as a :class:`click.ClickException`) it prints
``{"version": JSON_VERSION, "error": MESSAGE, "exit_code": N}`` on stdout instead, the usual
``Error: ...`` on stderr, and exits with the same code as without ``--json``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import click

#: The schema version of every ``--json`` document. Bumped when a field changes meaning or
#: disappears; fields may be added without a bump.
JSON_VERSION = 1

JSON_FLAG = "--json"


def document(body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` with the schema ``version`` first (``body`` may carry only this version)."""
    if body.get("version", JSON_VERSION) != JSON_VERSION:
        raise ValueError(f"a --json document is version {JSON_VERSION}, not {body['version']}")
    return {"version": JSON_VERSION, **body}


def emit(body: Mapping[str, Any]) -> None:
    """Print ``body`` as the command's one JSON document."""
    click.echo(json.dumps(document(body), indent=2, default=str))


def error_document(message: str, exit_code: int) -> dict[str, Any]:
    return document({"error": message, "exit_code": exit_code})


class JsonCommand(click.Command):
    """A click command whose ``--json`` output is one document even when it fails.

    Errors raised while parsing the arguments count when ``--json`` is among them; errors
    raised by the callback count when the parsed ``as_json`` parameter is true.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        wants_json = _json_requested(args)
        try:
            return super().parse_args(ctx, args)
        except click.ClickException as e:
            if not wants_json:
                raise
            _fail(e)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException as e:
            if not ctx.params.get("as_json"):
                raise
            _fail(e)


def _json_requested(args: Sequence[str]) -> bool:
    for a in args:
        if a == "--":
            return False
        if a == JSON_FLAG:
            return True
    return False


def _fail(e: click.ClickException) -> NoReturn:
    click.echo(json.dumps(error_document(e.format_message(), e.exit_code), indent=2))
    e.show()
    raise click.exceptions.Exit(e.exit_code) from e
