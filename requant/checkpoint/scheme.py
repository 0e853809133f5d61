"""The one quantization scheme requant accepts, checked field by field.

requant's arithmetic is only correct for symmetric int8 weights with one scale per output
channel and no zero point, served with dynamic per-token int8 activations (W8A8 as
llm-compressor writes it in the compressed-tensors format). Everything else (asymmetric,
group/tensor/block strategies, 4-bit, static activation scales, fp8, a KV-cache scheme)
would be silently mis-converted, so it is refused, and the message names the offending
field by its path in config.json (e.g. `quantization_config.config_groups.group_0.weights.strategy`).

Also produced here: `quantization_config(...)`, the exact block the synthetic generator
writes, laid out as compressed-tensors serialises it.
"""

from __future__ import annotations

from dataclasses import dataclass

from requant.errors import SchemeError

WEIGHTS = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}
ACTIVATIONS = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
# Fields that must be absent or null for either argument set.
MUST_BE_NULL = ("group_size", "block_structure")


@dataclass(frozen=True)
class Scheme:
    """What the rest of requant needs from a validated quantization_config."""

    ignore: tuple[str, ...]


def _quantization_args(file: str, where: str, args, want: dict, *, dynamic: bool) -> None:
    if not isinstance(args, dict):
        raise SchemeError(f"{where} must be an object, got {args!r}", file=file)
    for key, value in want.items():
        got = args.get(key, "<missing>")
        # bool is an int in Python: compare types too so `true` never passes for 8.
        if got != value or type(got) is not type(value):
            raise SchemeError(f"{where}.{key} is {got!r}, requant needs {value!r}", file=file)
    for key in MUST_BE_NULL:
        if args.get(key) is not None:
            raise SchemeError(f"{where}.{key} is {args[key]!r}, requant needs null", file=file)
    if not dynamic and args.get("dynamic", False) not in (False,):
        raise SchemeError(
            f"{where}.dynamic is {args.get('dynamic')!r}, requant needs false (static per-channel weights)", file=file
        )


def validate(config: dict, file: str = "config.json") -> Scheme:
    """Check config['quantization_config']; return the Scheme or raise SchemeError."""
    qc = config.get("quantization_config")
    if qc is None:
        raise SchemeError("no quantization_config: not a quantized checkpoint", file=file)
    if not isinstance(qc, dict):
        raise SchemeError("quantization_config must be an object", file=file)
    p = "quantization_config"
    if qc.get("quant_method") != "compressed-tensors":
        raise SchemeError(
            f"{p}.quant_method is {qc.get('quant_method')!r}, requant needs 'compressed-tensors'", file=file
        )
    if qc.get("format") != "int-quantized":
        raise SchemeError(f"{p}.format is {qc.get('format')!r}, requant needs 'int-quantized'", file=file)
    status = qc.get("quantization_status", "compressed")
    if status != "compressed":
        raise SchemeError(f"{p}.quantization_status is {status!r}, requant needs 'compressed'", file=file)
    if qc.get("kv_cache_scheme") is not None:
        raise SchemeError(
            f"{p}.kv_cache_scheme is set; requant handles no KV-cache quantization (needs null)", file=file
        )
    sparsity = qc.get("sparsity_config")
    if sparsity not in (None, {}):
        raise SchemeError(f"{p}.sparsity_config is set; requant handles dense checkpoints only", file=file)
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise SchemeError(f"{p}.config_groups must be a non-empty object", file=file)
    for gname, group in groups.items():
        g = f"{p}.config_groups.{gname}"
        if not isinstance(group, dict):
            raise SchemeError(f"{g} must be an object", file=file)
        if "weights" not in group or group["weights"] is None:
            raise SchemeError(f"{g}.weights is missing: requant needs int8 per-channel weights", file=file)
        _quantization_args(file, f"{g}.weights", group["weights"], WEIGHTS, dynamic=False)
        if group.get("input_activations") is None:
            raise SchemeError(
                f"{g}.input_activations is missing: requant needs dynamic per-token int8 activations", file=file
            )
        _quantization_args(file, f"{g}.input_activations", group["input_activations"], ACTIVATIONS, dynamic=True)
        if group.get("output_activations") is not None:
            raise SchemeError(f"{g}.output_activations is set; requant needs null", file=file)
        t = group.get("targets")
        if not isinstance(t, list) or not t or not all(isinstance(x, str) for x in t):
            raise SchemeError(f"{g}.targets must be a non-empty list of strings, got {t!r}", file=file)
    ignore = qc.get("ignore", [])
    if ignore is None:
        ignore = []
    if not isinstance(ignore, list) or not all(isinstance(x, str) for x in ignore):
        raise SchemeError(f"{p}.ignore must be a list of module names, got {ignore!r}", file=file)
    return Scheme(ignore=tuple(ignore))


def quantization_config(
    *, ignore=("lm_head",), compression_ratio: float | None = None, version: str = "0.10.2"
) -> dict:
    """The W8A8 quantization_config block as llm-compressor / compressed-tensors write it."""

    def args(strategy: str, dynamic: bool, observer):
        return {
            "actorder": None,
            "block_structure": None,
            "dynamic": dynamic,
            "group_size": None,
            "num_bits": 8,
            "observer": observer,
            "observer_kwargs": {},
            "strategy": strategy,
            "symmetric": True,
            "type": "int",
        }

    return {
        "config_groups": {
            "group_0": {
                "input_activations": args("token", True, None),
                "output_activations": None,
                "targets": ["Linear"],
                "weights": args("channel", False, "minmax"),
            }
        },
        "format": "int-quantized",
        "global_compression_ratio": compression_ratio,
        "ignore": list(ignore),
        "kv_cache_scheme": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
        "sparsity_config": {},
        "version": version,
    }
