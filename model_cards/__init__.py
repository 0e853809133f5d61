"""Model-card templates for publishing requant checkpoints (installed as requant.model_cards).

`requant_w8a8.md.j2` is the Jinja2 template of the Hub README that `requant card` and
`requant push` render (requant.publish.card builds its context). It is shipped as package
data, so an installed wheel renders the same card as a checkout.
"""

if __name__ == "model_cards":  # imported from the clone's root under its bare name: requant/_toplevel.py
    from requant._toplevel import hand_over

    hand_over(__name__, __file__)


from pathlib import Path

TEMPLATE = "requant_w8a8.md.j2"


def template_path(name: str = TEMPLATE) -> Path:
    """Path of a template shipped in this package."""
    return Path(__file__).resolve().parent / name
