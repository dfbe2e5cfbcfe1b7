"""The file formats a tokenizer and a run are written in (GPT-2 files, tokenizer.json, manifest, tiktoken,
token files, checkpoints); built on :mod:`superbpe.core` alone."""
