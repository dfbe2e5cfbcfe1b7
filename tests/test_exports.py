"""Exports other libraries load: transformers (AutoTokenizer) and tiktoken give our ids; padded vocabs."""

from __future__ import annotations

import base64
import json
import logging
import pickle
import warnings
from pathlib import Path

import pytest
import regex
import tiktoken
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st

import superbpe
from superbpe.api.tokenizer import Tokenizer
from superbpe.core.errors import ConfigError, InputError
from superbpe.core.pretokenize import SPLIT_PROBE, get_pretokenizer
from superbpe.core.vocab import reserved_tokens
from superbpe.engines.interface import native_available
from superbpe.formats.hf import HF_CONFIG_FILE, HF_SPECIAL_MAP_FILE, resolve_roles
from superbpe.formats.manifest import MANIFEST_FILE
from superbpe.formats.tiktoken_files import TIKTOKEN_META_FILE, tiktoken_pattern

EOT = "<|endoftext|>"
PATTERNS = ["gpt2", "cl100k", "o200k", "superbpe-stage1", "superbpe", "superbpe-paper"]
SETTINGS = settings(max_examples=300, deadline=None)
#: Text made of what the patterns treat specially: letters of several scripts and cases, digits, marks,
#: apostrophes, punctuation and every kind of whitespace, in short runs.
TRICKY_CHARS = "aZé ß日本1234567890'sdtlmrv.,:/!?-_\n\r\t  \u00a0\u0301\u3000"
TRICKY = st.text(alphabet=st.sampled_from(list(TRICKY_CHARS)), max_size=80)


@pytest.fixture(scope="module", params=PATTERNS)
def trained(request: pytest.FixtureRequest, sample_texts: Path) -> Tokenizer:
    """A tokenizer per pattern; the stage-2 patterns (line units on) with multi-word tokens."""
    vocab, merges = superbpe.train_bpe(sample_texts / "corpus.en", 1200, [EOT, "<pad>"],
                                       pretokenizer=request.param, max_words_per_token=4, engine="auto")
    return Tokenizer(vocab, merges, [EOT, "<pad>"], pretokenizer=request.param)


@pytest.fixture(scope="module")
def texts(sample_texts: Path, multilingual_text: str, wikitext_text: str) -> list[str]:
    """Every shared text (held out from training except corpus.en), with specials and line-edge cases."""
    small = [(sample_texts / name).read_text(encoding="utf-8")
             for name in ("tinystories_sample.txt", "address.txt", "german.txt", "corpus.en")]
    edges = "a\n\nb  \n c\n\r\n  x:: //\n\n/ 1234567 " + EOT + "  <pad>\n\n"
    return [*small, multilingual_text[:300_000], wikitext_text[:300_000], edges]


def test_tiktoken_encoding_gives_our_ids(trained: Tokenizer, texts: list[str]) -> None:
    encoding = trained.to_tiktoken()
    for text in texts:
        ids = trained.encode(text)
        assert encoding.encode(text, allowed_special="all") == ids
        assert encoding.decode(ids) == text


@pytest.mark.parametrize("asked", ["yes", 1, None])
def test_tiktoken_files_are_asked_for_with_a_bool(trained: Tokenizer, tmp_path: Path, asked: object) -> None:
    with pytest.raises(ConfigError, match="tiktoken must be True or False"):
        trained.save(tmp_path / "tok", tiktoken=asked)  # type: ignore[arg-type]
    assert not (tmp_path / "tok").exists()


def test_tiktoken_files_rebuild_the_same_encoding(
    trained: Tokenizer, texts: list[str], tmp_path: Path
) -> None:
    trained.save(tmp_path, tiktoken=True)
    meta = json.loads((tmp_path / TIKTOKEN_META_FILE).read_text(encoding="utf-8"))
    ranks = {}
    for line in (tmp_path / meta["ranks_file"]).read_text(encoding="ascii").splitlines():
        token, rank = line.split(" ")
        ranks[base64.b64decode(token)] = int(rank)
    encoding = tiktoken.Encoding(name=meta["name"], pat_str=meta["pat_str"], mergeable_ranks=ranks,
                                 special_tokens=meta["special_tokens"])
    for text in texts[-3:]:
        assert encoding.encode(text, allowed_special="all") == trained.encode(text)


def test_transformers_auto_tokenizer_loads_the_directory(trained: Tokenizer, texts: list[str],
                                                          tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    trained.save(tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert (hf.eos_token, hf.bos_token, hf.pad_token) == (EOT, EOT, None)
    assert hf.eos_token_id == trained.token_to_id(EOT)
    assert "<pad>" in hf.all_special_tokens and len(hf) == trained.vocab_size
    for text in texts:
        sample = text[:50_000]
        ids = trained.encode(sample)
        assert hf.encode(sample) == ids
        assert hf.decode(ids) == sample


def test_a_tokenizer_json_saved_over_by_transformers_is_not_ignored(
    tmp_path: Path, sample_texts: Path
) -> None:
    """Tokens added in transformers and saved into the directory changed tokenizer.json only: loading the
    directory by its manifest encoded as before, so the training data and the model's tokenizer disagreed
    with no word said. The manifest keeps tokenizer.json's fingerprint; the new file loads on its own. A
    file saved again with nothing changed (in HF's own layout) loads: it encodes alike."""
    tokenizers = pytest.importorskip("tokenizers")
    vocab, merges = superbpe.train_bpe(sample_texts / "corpus.en", 600, [EOT])
    Tokenizer(vocab, merges, [EOT]).save(tmp_path / "tok")
    assert Tokenizer.load(tmp_path / "tok").special_tokens == [EOT]  # as saved: loads
    saved = (tmp_path / "tok" / "tokenizer.json").read_bytes()
    (tmp_path / "tok" / "tokenizer.json").write_bytes(saved.replace(b"\n", b"\r\n"))  # git's autocrlf
    assert Tokenizer.load(tmp_path / "tok").special_tokens == [EOT]
    hf = tokenizers.Tokenizer.from_file(str(tmp_path / "tok" / "tokenizer.json"))
    hf.save(str(tmp_path / "tok" / "tokenizer.json"))  # its own layout (save_pretrained's), nothing added
    assert (tmp_path / "tok" / "tokenizer.json").read_bytes().replace(b"\r\n", b"\n") != saved
    assert Tokenizer.load(tmp_path / "tok").encode(f"a b{EOT}") == hf.encode(f"a b{EOT}").ids
    hf.add_special_tokens(["<|im_start|>"])
    hf.save(str(tmp_path / "tok" / "tokenizer.json"))
    with pytest.raises(InputError, match=r"tokenizer.json is not the tokenizer.json saved with superbpe"):
        Tokenizer.load(tmp_path / "tok")
    bare = tmp_path / "bare"  # tokenizer.json is then what the manifest's tokenizer is read from
    bare.mkdir()
    for name in (MANIFEST_FILE, "tokenizer.json"):
        (bare / name).write_bytes((tmp_path / "tok" / name).read_bytes())
    with pytest.raises(InputError, match=r"tokenizer.json is not the tokenizer.json saved with superbpe"):
        Tokenizer.load(bare)
    (tmp_path / "alone").mkdir()
    (tmp_path / "tok" / "tokenizer.json").rename(tmp_path / "alone" / "tokenizer.json")
    alone = Tokenizer.load(tmp_path / "alone")
    assert alone.encode("<|im_start|>hi") == hf.encode("<|im_start|>hi").ids
    assert Tokenizer.load(tmp_path / "tok").special_tokens == [EOT]  # no tokenizer.json: nothing to differ


def test_a_special_token_that_merges_also_make_exports_alike(tmp_path: Path, sample_texts: Path) -> None:
    """A special that is also a merged token (" the") was left out of tokenizer.json's model vocab, which
    HF then refused to load (its merges name the token), and tiktoken's ranks (a misleading order error)."""
    vocab, merges = superbpe.train_bpe(sample_texts / "corpus.en", 600, [])
    tok = Tokenizer(vocab, merges, [" the", EOT])
    tok.save(tmp_path / "tok")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "tokenizer.json").write_bytes((tmp_path / "tok" / "tokenizer.json").read_bytes())
    hf = tokenizers.Tokenizer.from_file(str(tmp_path / "tok" / "tokenizer.json"))
    again = Tokenizer.load(tmp_path / "hf")
    encoding = tok.to_tiktoken()
    for text in ["in the end" + EOT, "the theater", " the", "them", "Then the  the"]:
        ids = tok.encode(text)
        assert ids == hf.encode(text).ids == again.encode(text)
        assert ids == encoding.encode(text, allowed_special="all")
    assert again.special_tokens == [" the", EOT] and again.vocab == tok.vocab


@pytest.mark.parametrize(("special", "text"), [("Ġthe", "in the end"), ("Ã©", "café"), ("ĠĠ", "a  ")])
def test_a_special_spelling_a_piece_in_the_byte_table_is_not_exported_to_encode_otherwise(
    tmp_path: Path, special: str, text: str
) -> None:
    """HF looks a whole piece up by its byte-table spelling (ignore_merges), where the special is listed
    under its own text: every " the" of the text got the id of the special "Ġthe", which ours encodes as
    bytes. Refused with whole pieces; without them HF reaches the token only through merges, and agrees."""
    byte_vocab = {i: bytes([i]) for i in range(256)}
    with pytest.raises(ConfigError, match=f"special token {special!r} is how tokenizer.json spells the text"):
        Tokenizer(byte_vocab, [], [special]).save(tmp_path / "whole")
    assert not (tmp_path / "whole").exists()
    merged = Tokenizer(byte_vocab, [], [special], whole_pieces=False)
    merged.save(tmp_path / "merged")
    hf = tokenizers.Tokenizer.from_file(str(tmp_path / "merged" / "tokenizer.json"))
    assert hf.encode(text + special).ids == merged.encode(text + special)


def test_roles_are_configurable_and_checked(tmp_path: Path, sample_texts: Path) -> None:
    transformers = pytest.importorskip("transformers")
    vocab, merges = superbpe.train_bpe(sample_texts / "german.txt", 300, [EOT, "<pad>"])
    tok = Tokenizer(vocab, merges, [EOT, "<pad>"])
    tok.save(tmp_path, roles={"pad_token": "<pad>", "bos_token": None})
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert (hf.bos_token, hf.eos_token, hf.pad_token) == (None, EOT, "<pad>")
    assert hf.pad_token_id == tok.token_to_id("<pad>")
    with pytest.raises(ConfigError, match="pad_token '<mask>' is not one of the special tokens"):
        tok.save(tmp_path / "bad", roles={"pad_token": "<mask>"})
    with pytest.raises(ConfigError, match=r"the reserved padding tokens are made with the vocabulary"):
        resolve_roles({"pad_token": "<|reserved_0|>"}, [EOT])
    # Not a mapping, or not a token: one line each, not a TypeError or AttributeError from inside.
    with pytest.raises(ConfigError, match="roles must map a role to a special token"):
        tok.save(tmp_path / "bad", roles="<pad>")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="pad_token must be a special token .a str. or None, not 5"):
        tok.save(tmp_path / "bad", roles={"pad_token": 5})  # type: ignore[dict-item]
    padded = [EOT, *(f"<|reserved_{i}|>" for i in range(20))]
    with pytest.raises(ConfigError, match=r"special tokens \['<\|endoftext\|>', .*\(21 in all\)\]$"):
        resolve_roles({"pad_token": "<pad>"}, padded)
    assert not (tmp_path / "bad").exists()


def test_reserved_tokens_round_up_and_skip_taken_names() -> None:
    assert reserved_tokens(256, 128) == []
    assert reserved_tokens(300, 128) == [f"<|reserved_{i}|>" for i in range(84)]
    assert reserved_tokens(257, 4, ["<|reserved_0|>"]) == [f"<|reserved_{i}|>" for i in (1, 2, 3)]
    with pytest.raises(ConfigError, match="pad_vocab_to_multiple_of must be a positive integer"):
        reserved_tokens(300, 0)


def test_padded_run_agrees_across_every_export(tmp_path: Path, sample_texts: Path) -> None:
    from superbpe.training.config import DataConfig, ExportConfig, TrainConfig
    from superbpe.training.run import run_training

    out = tmp_path / "run"
    cfg = TrainConfig(data=DataConfig(paths=[str(sample_texts / "corpus.en")]), vocab_size=1000,
                      cache_dir=None, output_dir=str(out), pad_vocab_to_multiple_of=64,
                      export=ExportConfig(tiktoken=True))
    run_training(cfg)
    tok = Tokenizer.load(out)
    assert tok.vocab_size == 1024 and tok.special_tokens[-1] == "<|reserved_23|>"
    ids = {special: tok.token_to_id(special) for special in tok.special_tokens}
    assert sorted(ids.values()) == list(range(999, 1024))  # <|endoftext|>, then 24 reserved
    vocab_json = json.loads((out / "vocab.json").read_text(encoding="utf-8"))
    hf_json = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    config = json.loads((out / HF_CONFIG_FILE).read_text(encoding="utf-8"))
    meta = json.loads((out / TIKTOKEN_META_FILE).read_text(encoding="utf-8"))
    for special, token_id in ids.items():
        assert vocab_json[special] == token_id
        assert {"id": token_id, "content": special}.items() <= hf_json["added_tokens"][token_id - 999].items()
        assert config["added_tokens_decoder"][str(token_id)]["content"] == special
        assert meta["special_tokens"][special] == token_id
    text = "hello <|reserved_5|> world" + EOT
    assert tok.to_tiktoken().encode(text, allowed_special="all") == tok.encode(text)
    assert ids["<|reserved_5|>"] in tok.encode(text)


def test_a_loaded_tokenizer_saved_elsewhere_keeps_its_roles_and_training_record(
    tmp_path: Path, sample_texts: Path
) -> None:
    """A load and a save dropped the pad role (transformers then could not pad) and the stages."""
    from superbpe.training.config import DataConfig, ExportConfig, TrainConfig
    from superbpe.training.run import run_training

    out, copy = tmp_path / "run", tmp_path / "copy"
    cfg = TrainConfig(data=DataConfig(paths=[str(sample_texts / "corpus.en")]), vocab_size=400,
                      special_tokens=[EOT, "<|pad|>"], cache_dir=None, output_dir=str(out),
                      export=ExportConfig(pad_token="<|pad|>"))  # fmt: skip
    run_training(cfg)
    loaded = Tokenizer.load(out)
    assert loaded.roles == {"bos_token": EOT, "eos_token": EOT, "pad_token": "<|pad|>"}
    loaded.save(copy)
    for name in (HF_SPECIAL_MAP_FILE, HF_CONFIG_FILE):
        assert json.loads((copy / name).read_text()) == json.loads((out / name).read_text())
    original, saved = (json.loads((d / MANIFEST_FILE).read_text()) for d in (out, copy))
    assert saved["stages"] == original["stages"] != [] and saved["training"] == original["training"] != {}
    assert Tokenizer.load(copy).roles == loaded.roles
    loaded.save(tmp_path / "no_pad", roles={"pad_token": None})
    assert "pad_token" not in Tokenizer.load(tmp_path / "no_pad").roles
    fresh = Tokenizer(loaded.vocab, loaded.merges, [EOT, "<|pad|>"])
    assert fresh.roles == {"bos_token": EOT, "eos_token": EOT}


def test_roles_are_read_from_tokenizer_config_where_there_is_no_special_tokens_map(
    tmp_path: Path, sample_texts: Path
) -> None:
    """transformers 5 saves roles only in tokenizer_config.json: a load took the default roles instead."""
    specials = [EOT, "<|pad|>", "<|im_start|>"]
    vocab, merges = superbpe.train_bpe(sample_texts / "corpus.en", 300, specials)
    roles = {"bos_token": "<|im_start|>", "eos_token": EOT, "pad_token": "<|pad|>"}
    Tokenizer(vocab, merges, specials).save(tmp_path / "tok", roles=roles)
    (tmp_path / "tok" / HF_SPECIAL_MAP_FILE).unlink()
    assert Tokenizer.load(tmp_path / "tok").roles == roles


def test_a_role_set_in_transformers_and_saved_over_the_directory_is_read(
    tmp_path: Path, sample_texts: Path
) -> None:
    """transformers 5 writes roles into tokenizer_config.json only and leaves our special_tokens_map.json as
    it was: a load read that file alone, so the pad token transformers reads was dropped (lost on save)."""
    transformers = pytest.importorskip("transformers")
    specials = [EOT, "<|pad|>"]
    vocab, merges = superbpe.train_bpe(sample_texts / "corpus.en", 300, specials)
    Tokenizer(vocab, merges, specials).save(tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    hf.pad_token = "<|pad|>"
    hf.save_pretrained(str(tmp_path))
    assert transformers.AutoTokenizer.from_pretrained(str(tmp_path)).pad_token == "<|pad|>"
    assert Tokenizer.load(tmp_path).roles == {"bos_token": EOT, "eos_token": EOT, "pad_token": "<|pad|>"}


@pytest.mark.parametrize(
    "roles_file", ['["<|endoftext|>"]', "{not json", '{"pad_token": 5, "eos_token": "<|endoftext|>"}',
                   '{"unk_token": "<unk>", "eos_token": {"content": "<|endoftext|>"}}'],
)  # fmt: skip
def test_token_roles_that_cannot_be_kept_are_passed_over_not_refused(
    tmp_path: Path, sample_texts: Path, roles_file: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Encoding never reads special_tokens_map.json: a file it cannot use stopped load, encode and save."""
    vocab, merges = superbpe.train_bpe(sample_texts / "corpus.en", 300, [EOT])
    Tokenizer(vocab, merges, [EOT]).save(tmp_path / "tok")
    (tmp_path / "tok" / HF_SPECIAL_MAP_FILE).write_text(roles_file)
    with caplog.at_level("WARNING", logger="superbpe"):
        loaded = Tokenizer.load(tmp_path / "tok")
    assert loaded.encode("hello") == Tokenizer(vocab, merges, [EOT]).encode("hello")
    assert HF_SPECIAL_MAP_FILE in caplog.text and set(loaded.roles.values()) <= {EOT}
    loaded.save(tmp_path / "again")


def test_padded_run_under_the_official_preset_numbers_its_reserved_tokens_one_after_another(
    tmp_path: Path, sample_texts: Path
) -> None:
    """The reserved tokens took every other id, up past the vocab size (a 384-row table met id 466)."""
    from superbpe.core.compat import OFFICIAL
    from superbpe.training.config import DataConfig, TrainConfig
    from superbpe.training.run import run_training

    out = tmp_path / "run"
    cfg = TrainConfig(data=DataConfig(paths=[str(sample_texts / "corpus.en")]), vocab_size=300,
                      special_tokens=[EOT, "<|pad|>"], cache_dir=None, output_dir=str(out),
                      pad_vocab_to_multiple_of=128, compat=OFFICIAL)  # fmt: skip
    run_training(cfg)
    tok = Tokenizer.load(out, compat="official")
    vocab_json = json.loads((out / "vocab.json").read_text(encoding="utf-8"))
    hf_ids = sorted(token["id"] for token in json.loads((out / "tokenizer.json").read_text())["added_tokens"])
    assert tok.vocab_size == 384 and sorted(vocab_json.values()) == list(range(384))
    reserved = [tok.token_to_id(f"<|reserved_{i}|>") for i in range(84)]
    assert reserved == list(range(300, 384)) and hf_ids[-84:] == reserved
    assert tok.decode(tok.encode("a<|reserved_83|>")) == "a<|reserved_83|>"
    with pytest.raises(ConfigError, match=r"do not grow in merge order \(as under compat=official"):
        tok.to_tiktoken()


@SETTINGS
@given(text=st.one_of(TRICKY, st.text(max_size=60)))
def test_covering_pattern_matches_are_the_isolated_split(text: str) -> None:
    for name in PATTERNS:
        pre = get_pretokenizer(name)
        covering = regex.compile(tiktoken_pattern(pre))
        assert [m.group() for m in covering.finditer(text)] == pre.split(text), name


_SPECIAL_MERGES = [(b"a", b"b"), (b"b", b"c"), (b"ab", b"c"), (b"c", b"<"), (b" ", b"a")]


@settings(max_examples=150, deadline=None)
@given(
    specials=st.lists(st.text(alphabet="abc<> \n", min_size=2, max_size=5), max_size=12, unique=True),
    text=st.text(alphabet="abc<> \n\u00e9", max_size=40),
    name=st.sampled_from(["gpt2", "superbpe"]),
)
def test_specials_that_overlap_encode_alike_in_both_engines_and_hf(
    tmp_path_factory: pytest.TempPathFactory, specials: list[str], text: str, name: str
) -> None:
    """Special tokens one of which begins, ends or holds another, with spaces and newlines, over text made
    of them (past eight, the encoder looks them up otherwise): leftmost, longest first, everywhere."""
    vocab = {i: bytes([i]) for i in range(256)}
    for left, right in _SPECIAL_MERGES:
        vocab[len(vocab)] = left + right
    specials = [s for s in specials if s.encode("utf-8") not in vocab.values()]
    engines = ["python", "native"] if native_available() else ["python"]
    tokenizers_ = [Tokenizer(dict(vocab), _SPECIAL_MERGES, specials, name, engine) for engine in engines]
    ids = tokenizers_[0].encode(text)
    directory = tmp_path_factory.mktemp("tok")
    tokenizers_[-1].save(directory)
    hf = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
    assert hf.encode(text, add_special_tokens=False).ids == ids
    for tok in tokenizers_:
        assert tok.encode(text) == ids
        assert tok.encode_batch([text, text]) == [ids, ids]
        assert tok.encode_utf8(text.encode("utf-8")).tolist() == ids


def test_gpt2_files_as_tiktoken_equal_the_reference(shared_data: Path, texts: list[str]) -> None:
    gpt2 = Tokenizer.from_files(shared_data / "gpt2_vocab.json", shared_data / "gpt2_merges.txt", [EOT])
    ours = gpt2.to_tiktoken()
    ranks = {token: token_id for token_id, token in gpt2.vocab.items() if token_id < 50256}
    reference = tiktoken.Encoding("gpt2-ref", pat_str=get_pretokenizer("gpt2").pattern, mergeable_ranks=ranks,
                                  special_tokens={EOT: 50256})
    for text in texts:
        assert ours.encode(text, allowed_special="all") == reference.encode(text, allowed_special="all")


def test_tiktoken_name_must_be_a_str() -> None:
    vocab = {i: bytes([i]) for i in range(256)} | {256: b"ab"}
    tokenizer = Tokenizer(vocab, [(b"a", b"b")], [EOT])
    assert tokenizer.to_tiktoken(name="mine").name == "mine"
    assert tokenizer.to_tiktoken().name == "gpt2"
    for name in (5, b"mine", ["mine"]):
        with pytest.raises(ConfigError, match=r"^name must be a str \(or None\), not "):
            tokenizer.to_tiktoken(name=name)  # type: ignore[arg-type]


def test_specials_one_beginning_another_have_no_tiktoken_form(tmp_path: Path, sample_texts: Path) -> None:
    """Where two specials start together this tokenizer takes the longer, tiktoken whichever it tries first:
    the export would give other ids, so each way to it is refused (a run's before training)."""
    from superbpe.training.config import DataConfig, ExportConfig, TrainConfig
    from superbpe.training.run import run_training

    specials = ["<|a|>", EOT, "<|a|><|b|>"]
    vocab, merges = superbpe.train_bpe(sample_texts / "corpus.en", 300, specials)
    tokenizer = Tokenizer(vocab, merges, specials)
    assert tokenizer.encode("<|a|><|b|>") == [tokenizer.token_to_id("<|a|><|b|>")]
    refused = "special token '<\\|a\\|>' begins '<\\|a\\|><\\|b\\|>'"
    with pytest.raises(ConfigError, match=refused):
        tokenizer.to_tiktoken()
    with pytest.raises(ConfigError, match=refused):
        tokenizer.save(tmp_path / "tok", tiktoken=True)
    assert not (tmp_path / "tok").exists()
    out = tmp_path / "run"
    cfg = TrainConfig(data=DataConfig(paths=[str(sample_texts / "corpus.en")]), vocab_size=300,
                      cache_dir=None, output_dir=str(out), special_tokens=specials,
                      export=ExportConfig(tiktoken=True))  # fmt: skip
    with pytest.raises(ConfigError, match=refused):
        run_training(cfg)
    assert not out.exists()
    # Specials that only share a start (no one begins another) export as before.
    Tokenizer(vocab, merges, ["<|a|>", EOT, "<|ab|>"]).to_tiktoken()


def test_a_tiktoken_export_the_official_preset_cannot_give_is_refused_before_training(
    tmp_path: Path, sample_texts: Path
) -> None:
    """compat=official keeps merges that make existing tokens, only the bytes it saw and no whole-piece
    lookup: tiktoken cannot encode like that, and finding out after training left a run no resume could
    finish (the resume refuses a changed export)."""
    from superbpe.core.compat import OFFICIAL  # the training modules are only needed here
    from superbpe.training.config import DataConfig, ExportConfig, TrainConfig
    from superbpe.training.run import run_training

    out = tmp_path / "run"
    cfg = TrainConfig(data=DataConfig(paths=[str(sample_texts / "corpus.en")]), vocab_size=1000,
                      cache_dir=None, output_dir=str(out), compat=OFFICIAL, special_tokens=[],
                      export=ExportConfig(tiktoken=True))  # fmt: skip
    refused = "cannot give the same ids under compat=official: alphabet=seen .*duplicates=merge .*whole_p"
    with pytest.raises(ConfigError, match=refused):
        run_training(cfg)
    assert not out.exists()


@pytest.mark.parametrize(
    ("pattern", "hf", "tiktoken_says"),
    [
        (r"\p{IsAlphabetic}+|\s+|.", "HF tokenizers cannot load the pattern (Oniguruma", None),
        (r"(?u)\w+|.", "HF tokenizers cannot load the pattern", None),
        (r"[[:alpha:]]+|[^[:alpha:]]", None, "tiktoken splits text otherwise"),  # fancy-regex: ASCII only
        (r"\X", "HF tokenizers splits text otherwise", "tiktoken cannot use the pattern"),  # conjuncts
        (r"\p{L}+|\p{N}+|\s+", None, None),
        (r"\w+|[^\w\s]+|\s+", "HF tokenizers splits text otherwise", None),  # Oniguruma: "x²y" one word
        (r"(?i)[a-z]+", "HF tokenizers splits text otherwise", "tiktoken splits text otherwise"),  # "İ"
    ],
)
def test_a_users_pattern_is_tried_in_hf_and_tiktoken(pattern: str, hf: str | None, tiktoken_says: str | None,
                                                     tmp_path: Path) -> None:  # fmt: skip
    """A pattern of the user's own went into tokenizer.json and the tiktoken files as it was: HF could not
    load some, and tiktoken read others with other pieces ("Straße"), so the ids differed with no word."""
    from superbpe.formats.hf import hf_split_problem  # the checks themselves, beside what they guard
    from superbpe.formats.tiktoken_files import tiktoken_split_problem

    pre = get_pretokenizer("custom", pattern=pattern)
    for found, expected in [(hf_split_problem(pre), hf), (tiktoken_split_problem(pre), tiktoken_says)]:
        assert (found is None) == (expected is None) and (found or "").startswith(expected or "")
    corpus = tmp_path / "probe.txt"  # many scripts: every pattern here (graphemes too) finds merges in it
    corpus.write_text(SPLIT_PROBE * 20, encoding="utf-8")
    vocab, merges = superbpe.train_bpe(corpus, 270, [EOT], pretokenizer=pre)
    tok = Tokenizer(vocab, merges, [EOT], pretokenizer=pre)
    if hf is None:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a pattern HF reads alike gets no warning
            tok.save(tmp_path / "a")
    else:
        with pytest.warns(UserWarning, match="tokenizer.json will not encode as this tokenizer does"):
            tok.save(tmp_path / "a")
    if tiktoken_says is None:
        assert tok.to_tiktoken().encode(SPLIT_PROBE) == tok.encode(SPLIT_PROBE)
    else:
        with pytest.raises(ConfigError, match="tiktoken cannot give this tokenizer's ids"):
            tok.to_tiktoken()
        with pytest.raises(ConfigError, match="tiktoken files cannot give the same ids"):
            tok.save(tmp_path / "b", tiktoken=True)
        assert not (tmp_path / "b").exists()


def test_a_run_tries_its_pattern_in_hf_and_tiktoken_before_training(
    tmp_path: Path, sample_texts: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from superbpe.training.config import DataConfig, ExportConfig, PretokenizerConfig, TrainConfig
    from superbpe.training.run import run_training  # the training modules are only needed here

    def config(pattern: str, out: str, tiktoken: bool) -> TrainConfig:
        return TrainConfig(data=DataConfig(paths=[str(sample_texts / "corpus.en")]), vocab_size=300,
                           cache_dir=None, output_dir=str(tmp_path / out),
                           export=ExportConfig(tiktoken=tiktoken),
                           pretokenizer=PretokenizerConfig(name="custom", pattern=pattern))  # fmt: skip

    with pytest.raises(ConfigError, match="export.tiktoken=true cannot give the same ids: tiktoken splits"):
        run_training(config(r"[[:alpha:]]+|[^[:alpha:]]", "t", tiktoken=True))
    assert not (tmp_path / "t").exists()
    with caplog.at_level(logging.WARNING, logger="superbpe"):
        run_training(config(r"\p{IsAlphabetic}+|\s+|.", "h", tiktoken=False))
    assert "tokenizer.json will not encode as this tokenizer does (HF, transformers): HF" in caplog.text
    assert (tmp_path / "h" / "merges.txt").is_file()


def test_built_in_patterns_pass_the_probe() -> None:
    from superbpe.formats.hf import hf_split_problem  # the checks themselves, beside what they guard
    from superbpe.formats.tiktoken_files import tiktoken_split_problem

    for name in PATTERNS:
        built_in = get_pretokenizer(name)
        as_users = get_pretokenizer("custom", pattern=built_in.pattern, line_units=built_in.line_units)
        assert hf_split_problem(as_users) is None, name
        if not built_in.line_units:
            assert tiktoken_split_problem(as_users) is None, name


def test_official_preset_with_special_tokens_is_said_to_differ_from_the_recipe(
    tmp_path: Path, sample_texts: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The command's preset sets no special tokens; a library config of compat=OFFICIAL kept the default
    <|endoftext|> silently, and its files then differed from the official ones."""
    from superbpe.core.compat import OFFICIAL  # the training modules are only needed here
    from superbpe.training.config import DataConfig, TrainConfig
    from superbpe.training.run import prepare

    def config(specials: list[str]) -> TrainConfig:
        return TrainConfig(data=DataConfig(paths=[str(sample_texts / "corpus.en")]), vocab_size=600,
                           cache_dir=None, output_dir=str(tmp_path / "run"), compat=OFFICIAL,
                           special_tokens=specials)  # fmt: skip

    with caplog.at_level(logging.WARNING, logger="superbpe"):
        prepare(config([]))
    assert "compat=official with special tokens" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="superbpe"):
        prepare(config([EOT]))
    assert "with special tokens ['<|endoftext|>']: the official recipe has none" in caplog.text


def test_line_units_on_a_custom_pattern_have_no_tiktoken_form() -> None:
    pre = get_pretokenizer("custom:[a-z]+", line_units=True)
    with pytest.raises(ConfigError, match="no tiktoken pattern for pre-tokenizer"):
        tiktoken_pattern(pre)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda doc: doc.update(normalizer={"type": "NFKC"}), "normalizer NFKC"),
        (lambda doc: doc["model"].update(dropout=0.5), "BPE dropout 0.5"),
        (lambda doc: doc["pre_tokenizer"]["pretokenizers"][-1].update(add_prefix_space=True),
         "ByteLevel with add_prefix_space"),
        (lambda doc: doc["pre_tokenizer"]["pretokenizers"].insert(0, {"type": "Whitespace"}),
         "pre-tokenizer Whitespace"),
        (lambda doc: doc["pre_tokenizer"]["pretokenizers"][-1].update(use_regex=True),
         "ByteLevel's own regex after a Split"),
        (lambda doc: doc.update(pre_tokenizer=None), "no ByteLevel pre-tokenizer"),
    ],
)
def test_a_tokenizer_json_setting_we_do_not_reproduce_is_refused(tmp_path: Path, sample_texts: Path,
                                                                 change, named: str) -> None:  # fmt: skip
    """Each of these loaded without a word before and then encoded other ids than HF does."""
    import tokenizers

    vocab, merges = superbpe.train_bpe(sample_texts / "german.txt", 300, [EOT])
    Tokenizer(vocab, merges, [EOT]).save(tmp_path / "ours")
    document = json.loads((tmp_path / "ours" / "tokenizer.json").read_text(encoding="utf-8"))
    change(document)
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "tokenizer.json").write_text(json.dumps(document), encoding="utf-8")
    tokenizers.Tokenizer.from_file(str(tmp_path / "theirs" / "tokenizer.json"))  # HF takes it
    with pytest.raises(superbpe.SuperBPEError, match=f"tokenizer.json: {regex.escape(named)}"):
        Tokenizer.load(tmp_path / "theirs")
    text = "Straße 12"
    assert Tokenizer.load(tmp_path / "ours").encode(text) == Tokenizer(vocab, merges, [EOT]).encode(text)


def test_official_preset_refuses_a_run_whose_only_stage_comes_from_a_source(
    tmp_path: Path, sample_texts: Path
) -> None:
    """schedule=bpe from a source under compat=official counted no text, took its byte tokens from the
    merges' bytes and wrote a vocabulary lacking bytes its corpus holds (it could not encode it)."""
    from superbpe.core.compat import OFFICIAL  # reason: the training modules are only needed here
    from superbpe.training.config import DataConfig, ScheduleConfig, TrainConfig  # reason: as above
    from superbpe.training.run import run_training  # reason: as above

    vocab, merges = superbpe.train_bpe(sample_texts / "corpus.en", 500, [])
    Tokenizer(vocab, merges, []).save(tmp_path / "source")
    cfg = TrainConfig(data=DataConfig(paths=[str(sample_texts / "corpus.en")]), vocab_size=400,
                      special_tokens=[], cache_dir=None, output_dir=str(tmp_path / "out"), compat=OFFICIAL,
                      schedule=ScheduleConfig(from_tokenizer=str(tmp_path / "source")))  # fmt: skip
    with pytest.raises(ConfigError, match="compat=official takes its byte tokens from the text a stage"):
        run_training(cfg)
    assert not (tmp_path / "out").exists()


CHAT = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}{{ eos_token }}{% endfor %}"


@pytest.mark.parametrize("template", [CHAT, {"default": CHAT, "tool_use": "{{ tools }}" + CHAT}])
def test_transformers_settings_are_kept_through_a_load_and_a_save(
    tmp_path: Path, sample_texts: Path, template: str | dict[str, str]
) -> None:
    """A directory saved by transformers, loaded and saved again here, lost every setting but the token
    roles: the user's chat template, model_max_length, padding_side, clean_up_tokenization_spaces."""
    transformers = pytest.importorskip("transformers")
    vocab, merges = superbpe.train_bpe(sample_texts / "corpus.en", 300, [EOT])
    Tokenizer(vocab, merges, [EOT]).save(tmp_path / "ours")
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "ours"), padding_side="left",
                                                    model_max_length=4096)  # fmt: skip
    hf.chat_template, hf.clean_up_tokenization_spaces = template, True
    hf.save_pretrained(str(tmp_path / "hf"))
    loaded = Tokenizer.load(tmp_path / "hf")
    assert loaded.transformers_settings["chat_template"] == template
    assert loaded.transformers_settings["model_max_length"] == 4096
    with pytest.raises(TypeError):
        loaded.transformers_settings["padding_side"] = "right"  # type: ignore[index]
    pickle.loads(pickle.dumps(loaded)).save(tmp_path / "back")
    back = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "back"))
    assert (back.chat_template, back.model_max_length, back.padding_side) == (template, 4096, "left")
    assert back.clean_up_tokenization_spaces is True
    assert back.encode("Once upon a time" + EOT) == loaded.encode("Once upon a time" + EOT)


def test_a_save_over_a_directory_with_chat_templates_removes_those_it_does_not_write(
    tmp_path: Path, sample_texts: Path
) -> None:
    """A tokenizer without chat templates saved where another one's template files lie left them there, and
    the next load (ours or transformers') took them as its own."""
    transformers = pytest.importorskip("transformers")
    vocab, merges = superbpe.train_bpe(sample_texts / "corpus.en", 300, [EOT])
    Tokenizer(vocab, merges, [EOT]).save(tmp_path / "ours")
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "ours"))
    hf.chat_template = {"default": CHAT, "tool_use": "{{ tools }}" + CHAT}
    hf.save_pretrained(str(tmp_path / "dir"))
    (tmp_path / "dir" / "additional_chat_templates" / "notes.txt").write_text("kept", encoding="utf-8")
    Tokenizer(vocab, merges, [EOT]).save(tmp_path / "dir")
    assert "chat_template" not in Tokenizer.load(tmp_path / "dir").transformers_settings
    assert transformers.AutoTokenizer.from_pretrained(str(tmp_path / "dir")).chat_template is None
    assert (tmp_path / "dir" / "additional_chat_templates" / "notes.txt").is_file()  # not a template: kept


def test_a_tokenizer_made_here_writes_no_transformers_settings_but_its_own(
    tmp_path: Path, sample_texts: Path
) -> None:
    """The settings a load keeps add nothing to the files of a tokenizer trained here, nor of one loaded
    from such a directory."""
    vocab, merges = superbpe.train_bpe(sample_texts / "corpus.en", 300, [EOT, "<pad>"])
    Tokenizer(vocab, merges, [EOT, "<pad>"]).save(tmp_path / "tok")
    config = json.loads((tmp_path / "tok" / HF_CONFIG_FILE).read_text(encoding="utf-8"))
    added = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
    assert config == {
        "tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {"298": {"content": EOT, **added}, "299": {"content": "<pad>", **added}},
        "bos_token": EOT, "eos_token": EOT, "pad_token": None, "unk_token": None,
        "additional_special_tokens": ["<pad>"],
    }  # fmt: skip
    assert sorted(path.name for path in (tmp_path / "tok").iterdir()) == sorted(
        [HF_CONFIG_FILE, MANIFEST_FILE, "merges.txt", HF_SPECIAL_MAP_FILE, "tokenizer.json", "vocab.json"]
    )
    loaded = Tokenizer.load(tmp_path / "tok")
    assert dict(loaded.transformers_settings) == {"clean_up_tokenization_spaces": False}
    loaded.save(tmp_path / "again")
    for name in (HF_CONFIG_FILE, HF_SPECIAL_MAP_FILE, "tokenizer.json"):
        assert (tmp_path / "again" / name).read_bytes() == (tmp_path / "tok" / name).read_bytes()


def test_transformers_settings_that_cannot_be_kept_are_named(
    tmp_path: Path, sample_texts: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A chat template file that is not UTF-8 is passed over with a warning naming it (encoding never reads
    it); a template name that is no plain file name is refused in one line before a file is written."""
    vocab, merges = superbpe.train_bpe(sample_texts / "corpus.en", 300, [EOT])
    Tokenizer(vocab, merges, [EOT]).save(tmp_path / "tok")
    (tmp_path / "tok" / "chat_template.jinja").write_bytes(b"\xff{{ messages }}")
    with caplog.at_level("WARNING", logger="superbpe"):
        loaded = Tokenizer.load(tmp_path / "tok")
    assert "chat_template.jinja: not read" in caplog.text
    assert "chat_template" not in loaded.transformers_settings
    config = json.loads((tmp_path / "tok" / HF_CONFIG_FILE).read_text(encoding="utf-8"))
    config["chat_template"] = {"default": CHAT, "../outside": CHAT}
    (tmp_path / "tok" / HF_CONFIG_FILE).write_text(json.dumps(config), encoding="utf-8")
    (tmp_path / "tok" / "chat_template.jinja").unlink()
    with pytest.raises(ConfigError, match=r"^chat_template '../outside' must be a template .a str. named"):
        Tokenizer.load(tmp_path / "tok").save(tmp_path / "again")
    assert not (tmp_path / "again").exists()


def test_tokens_added_in_transformers_stay_not_special(tmp_path: Path, sample_texts: Path) -> None:
    """Tokens added with transformers' add_tokens ("special": false) loaded as special tokens: saved again,
    transformers took them as special, so decode(..., skip_special_tokens=True) dropped them."""
    transformers = pytest.importorskip("transformers")
    vocab, merges = superbpe.train_bpe(sample_texts / "corpus.en", 300, [EOT])
    Tokenizer(vocab, merges, [EOT]).save(tmp_path / "ours")
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "ours"))
    hf.add_tokens(["<think>", " banana", "ZZ"])
    hf.add_special_tokens({"additional_special_tokens": ["<|im_end|>"]})
    hf.save_pretrained(str(tmp_path / "hf"))
    loaded = Tokenizer.load(tmp_path / "hf")
    loaded.save(tmp_path / "back")
    back = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "back"))
    assert back.added_tokens_decoder == hf.added_tokens_decoder
    assert back.all_special_tokens == hf.all_special_tokens == [EOT, "<|im_end|>"]
    assert loaded.plain_added_tokens == ["<think>", " banana", "ZZ"]
    assert loaded.special_tokens == [EOT, "<think>", " banana", "ZZ", "<|im_end|>"]
    text = f"a<think>Once upon a banana ZZZ{EOT} x<|im_end|><think>"
    ids = loaded.encode(text)
    assert ids == hf.encode(text) == back.encode(text)
    for skip in (False, True):
        expected = hf.decode(ids, skip_special_tokens=skip)
        assert loaded.decode(ids, skip_special_tokens=skip) == expected
        assert back.decode(ids, skip_special_tokens=skip) == expected
    assert "<think>" in loaded.decode(ids, skip_special_tokens=True)
    for again in (Tokenizer.load(tmp_path / "back"), pickle.loads(pickle.dumps(loaded))):
        assert again.plain_added_tokens == loaded.plain_added_tokens and again.encode(text) == ids


def _with_added_tokens(tmp_path: Path, sample_texts: Path, *added: dict[str, object]) -> Path:
    """A directory of ``tokenizer.json`` alone, a trained one with ``added`` appended (HF's flags)."""
    vocab, merges = superbpe.train_bpe(sample_texts / "corpus.en", 300, [EOT])
    Tokenizer(vocab, merges, [EOT]).save(tmp_path / "tok")
    document = json.loads((tmp_path / "tok" / "tokenizer.json").read_text(encoding="utf-8"))
    flags = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": True, "special": False}
    for token_id, entry in enumerate(added, start=len(vocab)):
        document["added_tokens"].append({"id": token_id, **flags, **entry})
        document["model"]["vocab"][entry["content"]] = token_id
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "tokenizer.json").write_text(json.dumps(document), encoding="utf-8")
    return tmp_path / "hf"


def test_added_tokens_hf_cuts_out_otherwise_are_refused(tmp_path: Path, sample_texts: Path) -> None:
    """HF matches normalized added tokens (add_tokens') only after the others, and lstrip / rstrip /
    single_word change where it cuts: loaded anyway, such files encoded other ids than HF, unnoticed."""
    overlapping = _with_added_tokens(tmp_path / "a", sample_texts, {"content": "xab"},
                                     {"content": "bcy", "normalized": False, "special": True})  # fmt: skip
    hf = tokenizers.Tokenizer.from_file(str(overlapping / "tokenizer.json"))
    assert hf.encode("xabcy").ids[-1] == hf.token_to_id("bcy")  # not "xab" first, as one pass of all finds
    with pytest.raises(InputError, match=r"added tokens 'bcy' and 'xab' can overlap, and HF matches 'xab'"):
        Tokenizer.load(overlapping)
    stripped = _with_added_tokens(tmp_path / "b", sample_texts, {"content": "<think>", "lstrip": True})
    with pytest.raises(InputError, match=r"added token '<think>' has lstrip: superbpe does not reproduce it"):
        Tokenizer.load(stripped)
    apart = _with_added_tokens(tmp_path / "c", sample_texts, {"content": "xab"},
                               {"content": "<|im_end|>", "normalized": False, "special": True})  # fmt: skip
    tok = Tokenizer.load(apart)
    assert tok.plain_added_tokens == ["xab"]
    hf = tokenizers.Tokenizer.from_file(str(apart / "tokenizer.json"))
    assert tok.encode("axabc<|im_end|>xab") == hf.encode("axabc<|im_end|>xab").ids
    with pytest.raises(InputError, match=r"^skip_special_tokens must be True or False, not 'no'$"):
        tok.decode([1, 2], skip_special_tokens="no")  # type: ignore[arg-type]
    tok.save(tmp_path / "saved")
    manifest = json.loads((tmp_path / "saved" / MANIFEST_FILE).read_text(encoding="utf-8"))
    assert manifest["plain_added_tokens"] == ["xab"]
    manifest["plain_added_tokens"] = ["<think>"]
    (tmp_path / "saved" / MANIFEST_FILE).write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.raises(InputError, match=r"'plain_added_tokens' must be a list of some of its special"):
        Tokenizer.load(tmp_path / "saved")
