"""Model-card templates for publishing requant checkpoints (installed as requant.model_cards).

`requant_w8a8.md.j2` is the Jinja2 template of the Hub README that `requant card` and
`requant push` render (requant.publish.card builds its context). It is shipped as package
data, so an installed wheel renders the same card as a checkout.
"""

from pathlib import Path

TEMPLATE = "requant_w8a8.md.j2"


def template_path(name: str = TEMPLATE) -> Path:
    """Path of a template shipped in this package."""
    return Path(__file__).resolve().parent / name
