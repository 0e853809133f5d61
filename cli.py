"""Run the `requant` command line from a checkout: `python cli.py --help` (the same app as the
installed `requant` script; it lives in requant/cli.py, so that it installs with the package)."""

import os

if __name__ == "cli":  # imported from the clone's root under its bare name: requant/_toplevel.py
    from requant._toplevel import hand_over

    hand_over(__name__, __file__)
elif __name__ == "requant.cli":  # `import requant` found the folder holding this clone: requant/errors.py
    raise ImportError(
        f"`import requant` found the directory {os.path.dirname(os.path.abspath(__file__))} (a clone of the "
        "repository in the current directory, imported as a namespace package) instead of the installed "
        "package: run Python from another directory, or as `python -P` (PYTHONSAFEPATH=1)"
    )

from requant.cli import app  # noqa: E402

if __name__ == "__main__":
    app()
