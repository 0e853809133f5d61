"""The built-in English calibration prompts, shared by `requant audit` (prefill and capture)
and `requant determinism` (greedy decode). Fixed text, so that two runs, two machines or two
checkpoints see the same inputs; `--prompts N` takes the first N.
"""

from __future__ import annotations

CALIBRATION_PROMPTS = (
    "The quick brown fox jumps over the lazy dog.",
    "In 1905, Albert Einstein published four papers that changed physics.",
    "To bake bread, mix flour, water, salt and yeast, then let the dough rise.",
    "The mitochondria is the powerhouse of the cell.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "Rivers carry sediment from the mountains down to the sea.",
    "She asked whether the train to Lisbon left before noon.",
    "Prime numbers have exactly two distinct positive divisors.",
    "The committee will meet on Tuesday to review the budget proposal.",
    "Water boils at one hundred degrees Celsius at sea level.",
    "A good night's sleep improves memory and concentration.",
    "The orchestra tuned their instruments before the concert began.",
    "Photosynthesis converts light energy into chemical energy.",
    "He wrote the report in plain language so everyone could follow it.",
    "Interest rates rose for the third consecutive quarter.",
    "The library closes at eight o'clock on weekdays.",
)


def prompts(n: int) -> list[str]:
    """The first n calibration prompts; ValueError (naming --prompts) outside 1..16."""
    if n < 1:
        raise ValueError("--prompts must be at least 1")
    if n > len(CALIBRATION_PROMPTS):
        raise ValueError(f"--prompts at most {len(CALIBRATION_PROMPTS)} (the built-in calibration set)")
    return list(CALIBRATION_PROMPTS[:n])
