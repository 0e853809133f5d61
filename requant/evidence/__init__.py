"""Evidence about a checkpoint: which bytes, made from what, by which code.

manifest.py    SHA256SUMS: a plain sha256 of every file (`sha256sum -c` checks it); its
               digest names the checkpoint's bytes in every report
identity.py    the four keys every report carries (manifest, manifest_digest,
               tool_version, git_commit), computed once before a long run
buildinfo.py   tool_version and git_commit of the running code
provenance.py  what `requant convert` records in its output: SHA256SUMS.source, the
               config.json "requant" key, requant-convert.json
origin.py      `--source`: the proof that bf16 weights are the origin of an int8 checkpoint
verify.py      `requant verify A B`: the same bytes, or where they differ

Imports checkpoint, io, scales and errors; never convert, runtime or above. Docs: docs/publishing.md.
"""
