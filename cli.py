"""Run the `requant` command line from a checkout: `python cli.py --help` (the same app as the
installed `requant` script; it lives in requant/cli.py, so that it installs with the package)."""

from requant.cli import app

if __name__ == "__main__":
    app()
