"""Power-of-two weight scales and the int8 weights under them.

    exponents.py    exact power-of-two exponents of fp32/bf16 scales (frexp), per arm
    arms.py         the arms (unconstrained, nearest, ceiling, mse, probe) and their statistics
    requantizer.py  requantization of int8 rows to a new scale, exactly
    from_source.py  RTN quantization of bf16 weights (llm-compressor's arithmetic) and
                    quantization from the original weights under each arm

Names only here (no torch), so that the command line can list the arms without importing torch.
Imports nothing else of requant (tests/test_layers.py). Docs: docs/checkpoints.md#arms---arm.
"""

ARMS = ("unconstrained", "nearest", "ceiling", "mse", "probe")
SERVABLE = {"unconstrained": True, "nearest": True, "ceiling": True, "mse": True, "probe": False}

__all__ = ["ARMS", "SERVABLE"]
