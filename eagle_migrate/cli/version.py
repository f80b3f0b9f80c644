from __future__ import annotations

from .. import __version__
from .options import COMMANDS, CommandOptions, JsonOpt
from .render import print_json, stdout


COMMANDS["version"] = CommandOptions(None, cli_only={"json": "how the version is printed"})  # no options


def version(json: JsonOpt = False) -> None:
    """Print the eagle-migrate version.

    Example: eagle-migrate version --json
    """
    if json:
        print_json({"version": __version__})
    else:
        stdout.print(f"eagle-migrate {__version__}")
