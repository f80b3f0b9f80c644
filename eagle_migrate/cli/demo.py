from __future__ import annotations

from ..options import JsonOpt
from . import app
from .render import print_json, stdout


@app.command()
def demo(json: JsonOpt = False) -> None:
    """Run the whole pipeline on an embedded tiny target/drafter pair (publish as --dry-run).

    Example: eagle-migrate demo
    """
    msg = "the demo pipeline is not built yet (issue: publish, migrate and demo); try `eagle-migrate inspect --help`"
    if json:
        print_json({"status": "not-yet", "message": msg})
    else:
        stdout.print(msg)
