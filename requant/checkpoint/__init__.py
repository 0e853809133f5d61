"""Open a W8A8 compressed-tensors checkpoint: validate everything first, read lazily.

This is the one place that decides whether a directory is a checkpoint requant accepts.
`open_checkpoint` resolves the source (a local directory, or a Hub repo id through
`huggingface_hub.snapshot_download`, which honours HF_HUB_OFFLINE and the local cache),
then checks the config, every shard header and every scale before any tensor data is used by
anyone (the full list: docs/checkpoints.md#input).

  __init__       open_checkpoint, Checkpoint: the validated, lazily read checkpoint
  scheme         the one quantization scheme accepted, checked field by field
  moe            the Qwen3-MoE tensor layout, checked after the generic checks
  inspect        `requant inspect`
  synthetic      seeded random Qwen3-shaped W8A8 checkpoints (`python -m requant.checkpoint.synthetic`);
                 synthetic_moe its Qwen3-MoE presets

Imports io, models, scales, errors (and, for inspect, evidence and kernels); never convert, runtime
or above (tests/test_layers.py).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch

from requant.checkpoint import scheme as scheme_mod
from requant.errors import CheckpointError, LayoutError, SafetensorsFormatError, SchemeError, TensorError
from requant.io.inputs import load_json
from requant.io.links import check_inside
from requant.io.safetensors_io import SafetensorsFile, read_header

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
SCALE_DTYPES = ("BF16", "F16", "F32")
# Directories that are never part of a checkpoint (git metadata, huggingface_hub's local
# download cache): not copied by convert, not compared by verify.
SKIP_DIRS = frozenset({".cache", ".git"})
# Per-module tensors that mean a scheme requant does not handle.
FORBIDDEN_SUFFIXES = {
    ".weight_zero_point": "a weight zero point (asymmetric weights)",
    ".input_scale": "a static input scale (static activations)",
    ".input_zero_point": "an input zero point (asymmetric activations)",
    ".weight_g_idx": "a group index (group quantization)",
    ".weight_global_scale": "a global scale (not int8 W8A8)",
    ".weight_packed": "packed weights (not int-quantized)",
}
# Qwen3's Linear modules: they must be quantized unless the config ignores them.
LINEAR_LEAVES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")
# Model order inside a Qwen3 decoder layer (for sorting module names).
_RANK = {
    "model": 0,
    "lm_head": 1,
    "embed_tokens": 0,
    "layers": 1,
    "norm": 2,
    "input_layernorm": 0,
    "self_attn": 1,
    "post_attention_layernorm": 2,
    "mlp": 3,
    "gate": 3,  # the MoE router (mlp.gate), before its experts
    "experts": 4,
    "q_proj": 0,
    "k_proj": 1,
    "v_proj": 2,
    "o_proj": 3,
    "q_norm": 4,
    "k_norm": 5,
    "gate_proj": 0,
    "up_proj": 1,
    "down_proj": 2,
    "weight": 0,
    "weight_scale": 1,
}
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
ARCHITECTURES = ["Qwen3ForCausalLM"]
MODEL_TYPE = "qwen3"
# Each architecture requant reads, with its model_type: Qwen3 dense and Qwen3-MoE.
FAMILIES = {"Qwen3ForCausalLM": "qwen3", "Qwen3MoeForCausalLM": "qwen3_moe"}


def check_qwen3(config: dict, file: str | os.PathLike) -> None:
    """SchemeError naming `file` and the field unless config.json describes a Qwen3 dense model
    (architectures ["Qwen3ForCausalLM"], model_type "qwen3") or a Qwen3-MoE one
    (["Qwen3MoeForCausalLM"], "qwen3_moe", with valid expert fields): the one architecture
    check, for W8A8 checkpoints and bf16 directories alike, made before any tensor is read."""
    arch = config.get("architectures")
    names = " or ".join(FAMILIES)
    if not (isinstance(arch, list) and len(arch) == 1 and arch[0] in FAMILIES):
        shown = "missing" if arch is None else "is " + json.dumps(arch)[:120]
        raise SchemeError(f"architectures {shown}; requant supports {names} only", file=file)
    mt = config.get("model_type")
    if mt != FAMILIES[arch[0]]:
        shown = "missing" if mt is None else "is " + json.dumps(mt)[:120]
        raise SchemeError(f"model_type {shown}; requant supports {FAMILIES[arch[0]]!r} ({arch[0]}) only", file=file)
    if mt == "qwen3_moe":
        from requant.models.qwen3_moe import Qwen3MoeArch

        try:
            Qwen3MoeArch.from_config(config)
        except ValueError as exc:  # its messages start "config.json": the file is named by the error
            msg = str(exc).removeprefix("config.json").lstrip(": ")
            raise SchemeError(msg, file=file) from None


def model_order_key(name: str):
    """Sort key putting module names in model order (layer 2 before layer 10, q before k)."""
    key = []
    for part in name.split("."):
        if part.isdigit():
            key.append((0, int(part), ""))
        else:
            key.append((1, _RANK.get(part, 50), part))
    return key


def is_ignored(module: str, ignore: tuple[str, ...]) -> bool:
    """compressed-tensors' matching: 're:<regex>' entries, else the exact module name
    (or a dotted suffix of it)."""
    for entry in ignore:
        if entry.startswith("re:"):
            if re.match(entry[3:], module):
                return True
        elif module == entry or module.endswith("." + entry):
            return True
    return False


class Checkpoint:
    """A validated W8A8 checkpoint on local disk; tensors are read on demand."""

    def __init__(
        self,
        path: Path,
        config: dict,
        scheme: scheme_mod.Scheme,
        shards: dict[str, SafetensorsFile],
        weight_map: dict[str, str],
        index_file: Path | None,
        quantized_linears: list[str],
    ):
        self.path = path
        self.config = config
        self.scheme = scheme
        self.shards = shards  # shard file name -> parsed header, in file-name order
        self.weight_map = weight_map  # tensor name -> shard file name
        self.index_file = index_file
        self.quantized_linears = quantized_linears
        self.from_hub = False  # True when `path` is a snapshot that snapshot_download resolved

    # -- the contract ---------------------------------------------------------------
    def tensor(self, name: str) -> torch.Tensor:
        """Any tensor by its full name, read from whichever shard holds it."""
        return self.shard_of(name).tensor(name)

    def weight_and_scale(self, linear: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(int8 weight [out, in], scale [out, 1] in its stored dtype) of one quantized Linear."""
        if linear not in self._linear_set:
            raise TensorError("not a quantized Linear of this checkpoint", file=self.path, tensor=linear)
        return self.tensor(linear + ".weight"), self.tensor(linear + ".weight_scale")

    def tensor_names(self) -> list[str]:
        """Every tensor name, in model order."""
        return sorted(self.weight_map, key=model_order_key)

    # -- helpers --------------------------------------------------------------------
    @property
    def _linear_set(self) -> set[str]:
        return set(self.quantized_linears)

    def shard_of(self, name: str) -> SafetensorsFile:
        try:
            return self.shards[self.weight_map[name]]
        except KeyError:
            raise TensorError("no such tensor in the checkpoint", file=self.path, tensor=name) from None

    def info(self, name: str):
        return self.shard_of(name).info(name)

    @property
    def is_sharded(self) -> bool:
        return self.index_file is not None

    def __repr__(self) -> str:
        return f"Checkpoint({str(self.path)!r}, {len(self.quantized_linears)} quantized Linears, {len(self.shards)} shard(s))"


def resolve_source(src: str | os.PathLike, *, revision: str | None = None) -> tuple[Path, bool]:
    """(directory, from_hub): a local directory as is (False); otherwise a Hub repo id
    through snapshot_download (True: the directory is the snapshot it resolved to)."""
    p = Path(src)
    if p.exists():
        if not p.is_dir():
            raise LayoutError("not a directory (a checkpoint is a directory with config.json)", file=p)
        return p, False
    s = str(src)
    if not _REPO_ID.match(s) or s.startswith((".", "/", "~")):
        raise LayoutError("no such directory, and not a Hub repo id (org/name)", file=s)
    try:
        from huggingface_hub import snapshot_download

        from requant.io import hub_client

        hub_client.install()  # connect/read timeouts, bounded retries (REQUANT_HUB_TIMEOUT)

        # Weights, configs (generation_config.json too), tokenizer files, and what must travel
        # with a derived checkpoint: the card (license in its front matter), license files,
        # and requant's manifests. Not .gitattributes, nor other formats' weights.
        with hub_client.transfer():  # an interrupt ends a stalled download promptly
            local = snapshot_download(
                repo_id=s,
                revision=revision,
                allow_patterns=[
                    "*.json",
                    "*.safetensors",
                    "*.txt",
                    "*.model",
                    "*.jinja",
                    "*.tiktoken",
                    "README.md",
                    "LICENSE*",
                    "LICENCE*",
                    "NOTICE*",
                    "USE_POLICY*",
                    "SHA256SUMS",
                    "SHA256SUMS.source",
                ],
            )
    except Exception as exc:  # the hub raises many types; all mean "could not resolve"
        raise LayoutError(f"no such directory on this machine, and {_hub_miss(exc, s, revision)}", file=s) from None
    return Path(local), True


def _hub_miss(exc: Exception, repo_id: str, revision: str | None) -> str:
    """Why `repo_id` did not resolve on the Hub, in words (one line, no exception class names):
    a path mistyped on the command line usually also looks like an org/name repo id."""
    from huggingface_hub import errors

    from requant.io.hub_client import timed_out

    at = f" at revision {revision}" if revision else ""
    late = timed_out(exc)
    if late is not None:
        return f"the Hub repo {repo_id}{at} could not be fetched: {late}"
    if isinstance(exc, errors.LocalEntryNotFoundError):
        offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() not in ("", "0", "false", "no", "off")
        why = "HF_HUB_OFFLINE is set" if offline else "the Hub could not be reached"
        return f"the Hub repo {repo_id}{at} is not in the local cache either ({why})"
    if isinstance(exc, errors.GatedRepoError):
        return f"the Hub repo {repo_id} is gated (log in or set HF_TOKEN)"
    if isinstance(exc, errors.RevisionNotFoundError):
        return f"the Hub repo {repo_id} has no revision {revision}"
    if isinstance(exc, errors.RepositoryNotFoundError):
        return f"no Hub repo {repo_id} was found either (or it is private)"
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "no reason given")
    return f"the Hub repo {repo_id}{at} could not be fetched either: {first[:200]}"


def _load_json(path: Path, what: str):
    """A small JSON file of the checkpoint: a regular file, bounded, links inside it only (requant.io.inputs)."""

    if not (path.exists() or path.is_symlink()):
        raise LayoutError(f"missing {what}", file=path)
    return load_json(path, what=what, root=path.parent, error=LayoutError)


def _safe_shard_name(index: Path, name) -> str:
    if (
        not isinstance(name, str)
        or not name
        or name in (".", "..")
        or "/" in name
        or "\\" in name
        or "\x00" in name
        or not name.endswith(".safetensors")
    ):
        raise LayoutError(
            f"shard name {name!r} is not a plain .safetensors file name in the checkpoint directory (path traversal?)",
            file=index,
        )
    return name


def read_weight_files(path: Path, what: str = "") -> tuple[dict[str, SafetensorsFile], dict[str, str], Path | None]:
    """(shards, weight_map, index path or None) of a directory of weights: the one
    parser of `model.safetensors` / `model.safetensors.index.json`, for checkpoints and
    for --source directories alike (`what` prefixes its messages, e.g. "source weights: ").

    Checked: exactly one of the two layouts; the index is a JSON object with a non-empty
    weight_map of plain shard file names (no path traversal); every shard it names exists
    and has a valid header; the index and the shards agree tensor for tensor (each tensor
    in the shard the index names, and no shard holding a tensor the index places elsewhere)."""
    index_path = path / INDEX
    single_path = path / SINGLE
    for p in (index_path, single_path):
        if p.is_symlink():
            check_inside(path, p)
    weight_map: dict[str, str] = {}
    shards: dict[str, SafetensorsFile] = {}
    if index_path.exists():
        if single_path.exists():
            raise LayoutError(f"{what}both {SINGLE} and {INDEX} present: ambiguous weights", file=path)
        index = _load_json(index_path, "the shard index")
        wm = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(wm, dict) or not wm:
            raise LayoutError(f"{what}index has no weight_map object", file=index_path)
        for tname, shard in wm.items():
            weight_map[tname] = _safe_shard_name(index_path, shard)
        for shard in sorted(set(weight_map.values())):
            sp = path / shard
            if not sp.is_file():
                first = next(t for t, s in weight_map.items() if s == shard)
                raise LayoutError(
                    f"{what}index names shard {shard!r}, which does not exist", file=index_path, tensor=first
                )
            check_inside(path, sp)
            shards[shard] = read_header(sp)
        for tname, shard in weight_map.items():
            if tname not in shards[shard].tensors:
                raise LayoutError(
                    f"{what}index places the tensor in {shard!r}, which does not hold it", file=index_path, tensor=tname
                )
        for shard, f in shards.items():
            for tname in f.tensors:
                if weight_map.get(tname) != shard:
                    where = f"in {weight_map[tname]!r}" if tname in weight_map else "nowhere"
                    raise LayoutError(
                        f"{what}tensor stored in this shard but the index places it {where}", file=f.path, tensor=tname
                    )
        return shards, weight_map, index_path
    if single_path.exists():
        f = read_header(single_path)
        return {SINGLE: f}, {t: SINGLE for t in f.tensors}, None
    raise LayoutError(f"{what or 'no weights: '}neither {SINGLE} nor {INDEX}", file=path)


def open_checkpoint(src: str | os.PathLike, *, revision: str | None = None) -> Checkpoint:
    """Resolve, validate (config, every shard header, tensor layout, scale values) and
    return a Checkpoint. Raises CheckpointError (naming file and tensor) on any fault."""
    path, from_hub = resolve_source(src, revision=revision)
    config_path = path / CONFIG
    if config_path.is_symlink():
        check_inside(path, config_path)
    config = _load_json(config_path, "config.json")
    if not isinstance(config, dict):
        raise LayoutError("config.json is not a JSON object", file=config_path)
    check_qwen3(config, config_path)
    scheme = scheme_mod.validate(config, file=str(config_path))

    shards, weight_map, index_path = read_weight_files(path)
    ckpt = Checkpoint(path, config, scheme, shards, weight_map, index_path, [])
    ckpt.from_hub = from_hub
    ckpt.quantized_linears = _find_linears(ckpt)
    if config.get("model_type") == "qwen3_moe":
        from requant.checkpoint.moe import check_moe_layout

        check_moe_layout(ckpt)
    for linear in ckpt.quantized_linears:
        check_scale_values(
            ckpt.shard_of(linear + ".weight_scale").path,
            linear + ".weight_scale",
            ckpt.tensor(linear + ".weight_scale"),
        )
    return ckpt


def _find_linears(ckpt: Checkpoint) -> list[str]:
    names = ckpt.weight_map
    linears = []
    for tname in names:
        f = ckpt.shard_of(tname).path
        for suffix, what in FORBIDDEN_SUFFIXES.items():
            if tname.endswith(suffix):
                raise TensorError(
                    f"{what}: requant handles symmetric per-channel int8 weights with dynamic activations only",
                    file=f,
                    tensor=tname,
                )
        if tname.endswith(".weight_scale"):
            linears.append(tname[: -len(".weight_scale")])
    for linear in linears:
        wname, sname = linear + ".weight", linear + ".weight_scale"
        sf = ckpt.shard_of(sname)
        if wname not in names:
            raise TensorError("weight_scale without its weight", file=sf.path, tensor=sname)
        wf = ckpt.shard_of(wname)
        w, s = wf.info(wname), sf.info(sname)
        if w.dtype != "I8":
            raise TensorError(f"quantized weight stored as {w.dtype}, expected I8 (int8)", file=wf.path, tensor=wname)
        if len(w.shape) != 2 or 0 in w.shape:
            raise TensorError(
                f"quantized weight must be 2-D [out, in] and non-empty, got shape {list(w.shape)}",
                file=wf.path,
                tensor=wname,
            )
        if s.dtype not in SCALE_DTYPES:
            raise TensorError(
                f"weight scale stored as {s.dtype}, expected one of {', '.join(SCALE_DTYPES)}",
                file=sf.path,
                tensor=sname,
            )
        if s.shape != (w.shape[0], 1):
            raise TensorError(
                f"scale shape {list(s.shape)} does not match weight {list(w.shape)}: expected [{w.shape[0]}, 1] (per output channel)",
                file=sf.path,
                tensor=sname,
            )
        if is_ignored(linear, ckpt.scheme.ignore):
            raise TensorError(
                "module is in quantization_config.ignore but stored quantized", file=sf.path, tensor=sname
            )
    linear_set = set(linears)
    for tname in names:
        if not tname.endswith(".weight"):
            continue
        module = tname[: -len(".weight")]
        if module in linear_set:
            continue
        info = ckpt.info(tname)
        f = ckpt.shard_of(tname).path
        if info.dtype == "I8":
            raise TensorError("int8 Linear weight without a weight_scale", file=f, tensor=tname)
        if module.split(".")[-1] in LINEAR_LEAVES and not is_ignored(module, ckpt.scheme.ignore):
            raise TensorError(
                f"Linear stored as {info.dtype} without a weight_scale, but quantization_config does not ignore it",
                file=f,
                tensor=tname,
            )
    return sorted(linears, key=model_order_key)


def check_scale_values(file, name: str, scale: torch.Tensor) -> None:
    """Every scale finite, strictly positive and normal in its stored dtype, else TensorError
    naming the first bad row.

    Why subnormal scales are refused rather than carried: a scale is absmax / 127.5 of its
    output channel, so a subnormal one (below 2**-126 in bf16/fp32, 2**-14 in fp16) means
    weights of about 1e-36 (bf16) that the int8 grid cannot represent meaningfully; it has
    fewer significant bits than its dtype promises, and its power-of-two exponent lies outside
    the normal range that requant's arithmetic (requant.scales.exponents) and the audit's fault
    catalogue assume, where the catalogue's bounds then fail (false positives) although
    nothing is wrong with the kernels. No quantizer produces one (compressed-tensors clamps a
    scale to at least its dtype's eps), so a subnormal scale is a damaged or hand-made file."""
    s = scale.detach().to(torch.float64).reshape(-1)
    tiny = torch.finfo(scale.dtype).tiny if scale.dtype.is_floating_point else 0.0
    bad = ~(torch.isfinite(s) & (s > 0) & (s >= tiny))
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        v = float(s[row])
        kind = (
            "NaN"
            if v != v
            else (
                "infinite"
                if v in (float("inf"), float("-inf"))
                else ("zero" if v == 0 else ("negative" if v < 0 else "subnormal"))
            )
        )
        why = (
            f" (below {str(scale.dtype).removeprefix('torch.')}'s smallest normal {tiny:.4g}: requant and its "
            "audit need normal scales)"
            if kind == "subnormal"
            else ""
        )
        raise TensorError(
            f"{kind} scale {v!r} at output channel {row}{why} ({int(bad.sum())} bad scale(s) in all)",
            file=file,
            tensor=name,
        )


__all__ = [
    "Checkpoint",
    "open_checkpoint",
    "CheckpointError",
    "SafetensorsFormatError",
    "model_order_key",
    "is_ignored",
    "check_scale_values",
    "check_qwen3",
]
