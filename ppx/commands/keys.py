"""`ppx keys`: every config key with its default and meaning."""

from __future__ import annotations

import shutil
import sys
import textwrap


def cmd_keys(args) -> int:
    from ppx.config import describe
    from ppx.errors import UserError

    text = getattr(args, "text", None)
    rows = [r for r in describe() if text is None or text.lower() in r[0].lower()]
    if not rows:
        raise UserError(f"no key holds {text!r}; ppx keys lists every key")
    if args.markdown:
        print("| key | default | meaning |\n| --- | --- | --- |")
        for key, default, help in rows:
            print(f"| `{key}` | `{default}` | " + help.replace("|", "\\|") + " |")
        return 0
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else 0
    for line in lines(rows, width):
        print(line)
    return 0


def lines(rows: list[tuple[str, str, str]], width: int = 0) -> list[str]:
    """``key default meaning`` a row; on a terminal ``width`` wide (0: a file or a pipe, a row a
    line), the meaning wrapped under itself."""
    out = []
    for key, default, help in rows:
        line = f"{key:28} {default:10} {help}"
        if width < 60:
            out.append(line)
            continue
        out += textwrap.wrap(line, width, subsequent_indent=" " * 40, break_long_words=False, break_on_hyphens=False)
    return out
