"""Files in and out, for every other package.

  safetensors_io  the strict, byte-exact safetensors reader and writer (pread, never mmap)
  inputs          bounded reads of the small files (config.json, the index, reports)
  jsonlines       the one reader of user JSON-lines files (--prompts, generation records)
  links           which links inside a checkpoint are followed
  output          atomic, durable outputs: a checkpoint directory or a set of report files
  output_guard    no output lands on an input
  leftovers       what a killed run leaves, recognised by name and swept by the next run
  snapshot        the inputs a command read, pinned by stat, re-checked before a publication
  hub_client      bounded waits on the Hugging Face Hub
  space           free space and the mount point
  markdown        the one Markdown table writer

Imports only requant.errors (tests/test_layers.py). Why the files are read and written this way:
docs/checkpoints.md#reading-and-writing-the-decisions.
"""
