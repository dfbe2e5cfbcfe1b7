"""What ``import superbpe`` hands out: the :class:`~superbpe.api.tokenizer.Tokenizer` and the plain
training functions (``train_bpe``, ``count``), over the engines and the formats."""
