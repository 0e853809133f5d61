"""open_checkpoint on a Hub repo id keeps what must travel with a derived checkpoint: the card
(its license front matter), license files, generation config, tokenizer files and requant's
manifests; not the Hub's .gitattributes nor other formats' weights.

Served by the loopback Hub (tests/hubserver.py) through the real snapshot_download. Reference:
the file list written here by hand, and the bytes put on the server."""

from requant.checkpoint import open_checkpoint
from tests.requant.conftest import tree_bytes

EXTRA = {
    "README.md": b"---\nlicense: apache-2.0\n---\n# card\n",
    "LICENSE": b"Apache License\nVersion 2.0\n",
    "NOTICE": b"notice\n",
    "generation_config.json": b'{"do_sample": false}\n',
    "tokenizer.json": b"{}",
    "tokenizer_config.json": b"{}",
    "merges.txt": b"#version: 0.2\n",
    "chat_template.jinja": b"{{ messages }}",
    "SHA256SUMS": b"",
    "SHA256SUMS.source": b"",
    "pytorch_model.bin": b"not wanted",
    "notes.md": b"not wanted",
}


def test_snapshot_keeps_card_license_and_configs(hub, micro):
    files = {**tree_bytes(micro), **EXTRA}
    hub.create("org/micro-w8a8")
    hub.commit("org/micro-w8a8", "main", files, "upload")
    ck = open_checkpoint("org/micro-w8a8")
    got = tree_bytes(ck.path)
    assert set(got) == set(files) - {"pytorch_model.bin", "notes.md"}  # and not .gitattributes
    assert all(got[k] == files[k] for k in got)
    assert ck.from_hub and len(ck.quantized_linears) == 14
