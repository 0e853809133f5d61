"""The audit's model runtime now lives in requant.runtime (one runtime for the audit, the
evaluation and `requant determinism`); this module re-exports the helpers the audit used
from here before the move. The audit builds its model with requant.runtime.Model."""

from requant.runtime import check_layout, dense_names, load_dense, load_linears, rms_norm, rope

__all__ = ["check_layout", "dense_names", "load_dense", "load_linears", "rms_norm", "rope"]
