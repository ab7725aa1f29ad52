"""`ppx keys`: every config key with its default and meaning."""

from __future__ import annotations


def cmd_keys(args) -> int:
    from ppx.config import describe

    if args.markdown:
        print("| key | default | meaning |\n| --- | --- | --- |")
        for key, default, help in describe():
            print(f"| `{key}` | `{default}` | " + help.replace("|", "\\|") + " |")
        return 0
    for key, default, help in describe():
        print(f"{key:28} {default:10} {help}")
    return 0
