"""Publishing a requant checkpoint: its model card and its upload to the Hub.

    requant manifest CKPT [--write]     SHA256SUMS: check it, or write it (requant.evidence.manifest)
    requant card CKPT                   CKPT/README.md from the checkpoint and its reports (card.py)
    requant push CKPT REPO_ID           refuse without evidence for these bytes, else upload (push.py)

The evidence is a set of JSON reports beside the checkpoint (reports.py), each tied to the
checkpoint's bytes by the manifest digest it records. The typer commands live in requant/commands/publish.py.
Imports checkpoint, evidence, io, models, regime and model_cards; never the audit (the command passes
the fault titles in). Docs: docs/publishing.md.
"""

from requant.errors import CheckpointError


class PublishError(CheckpointError):
    """A card or push request that requant cannot carry out (a missing or mismatched report,
    a bad repo id, no token, the Hub refusing the upload): exit 2."""


class PushRefused(PublishError):
    """A push that requant's own rules refuse (no clean audit of these bytes, scales that are
    not powers of two, a non-servable arm): the check failed, exit 1."""
