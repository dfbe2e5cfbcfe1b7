"""Generated stand-ins for the shared test texts, so the suite runs in a fresh clone.

English prose comes from the docstrings of the Python standard library (present wherever Python is,
like the default training corpus); the other scripts come from a seeded random generator over word
shapes of each script. Only characters assigned by Unicode 14 are used: HF ``tokenizers`` and tiktoken
follow an older Unicode than the pinned ``regex`` and the parity tests compare with them.
"""

from __future__ import annotations

import ast
import random
import sysconfig
from pathlib import Path

EOT = "<|endoftext|>"

#: (first, last) code points of letters per script, all assigned long before Unicode 14.
SCRIPTS = {
    "latin": (0x61, 0x7A),
    "accented": (0xE0, 0xFF),
    "greek": (0x3B1, 0x3C9),
    "cyrillic": (0x430, 0x44F),
    "arabic": (0x627, 0x64A),
    "devanagari": (0x915, 0x939),
    "cjk": (0x4E00, 0x9FA5),
    "hangul": (0xAC00, 0xD7A3),
    "hiragana": (0x3041, 0x3093),
}
PUNCTUATION = [".", ",", "!", "?", ";", ":", " -", "…", "«", "»", "“", "”", "'s", "'ll", "（", "）", "。"]
DEVANAGARI_SIGNS = [chr(c) for c in range(0x93E, 0x94D)]
EXTRAS = ["😀", "👍🏽", "€", "½", "Ⅻ", "٣", "१२", "\u00a0", "\u3000", "\t", "  ", "2026", "3.14", "1,000,000"]


def stdlib_docstrings(limit_bytes: int) -> list[str]:
    """Module, class and function docstrings of the stdlib's top-level modules, in sorted order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    found: list[str] = []
    total = 0
    for path in sorted(stdlib.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 40:
                    found.append(doc)
                    total += len(doc)
                    if total >= limit_bytes:
                        return found
    return found


def english(limit_bytes: int, separator: str = EOT) -> str:
    """English documents (stdlib docstrings) joined by ``separator`` and newlines."""
    return (separator + "\n").join(doc + "\n" for doc in stdlib_docstrings(limit_bytes))[:limit_bytes]


def _word(rng: random.Random, script: str) -> str:
    low, high = SCRIPTS[script]
    length = rng.choice([1, 2, 2, 3]) if script in ("cjk", "hangul") else rng.randint(1, 9)
    word = "".join(chr(rng.randint(low, high)) for _ in range(length))
    if script == "devanagari" and rng.random() < 0.5:
        word += rng.choice(DEVANAGARI_SIGNS)
    if script in ("latin", "cyrillic", "greek") and rng.random() < 0.2:
        word = word.capitalize()
    return word


def multilingual(size: int, seed: int = 1) -> str:
    """Random lines in many scripts with punctuation, digits, emoji and odd whitespace; a fixed seed.

    Words are drawn from a small per-script lexicon so that pieces repeat, as in real text.
    """
    rng = random.Random(seed)
    lexicon = {script: [_word(rng, script) for _ in range(300)] for script in SCRIPTS}
    parts: list[str] = []
    total = 0
    while total < size:
        script = rng.choice(list(SCRIPTS))
        line = []
        for _ in range(rng.randint(1, 14)):
            line.append(rng.choice(lexicon[script]))
            roll = rng.random()
            if roll < 0.15:
                line.append(rng.choice(PUNCTUATION))
            elif roll < 0.2:
                line.append(rng.choice(EXTRAS))
            line.append("" if script in ("cjk", "hiragana") and rng.random() < 0.7 else " ")
        text = "".join(line).rstrip(" ") + rng.choice(["\n", "\n", "\n\n", " \n", "\r\n"])
        parts.append(text)
        total += len(text)
    return "".join(parts)[:size]


def german(seed: int = 2) -> str:
    """A few lines of German-like text (umlauts, ß, capitalised nouns)."""
    rng = random.Random(seed)
    words = ["Straße", "größer", "Bücher", "über", "Fußgänger", "schön", "Mädchen", "Käse", "Öl", "müde",
             "und", "der", "die", "das", "ist", "nicht", "Grüße", "wären", "Überraschung", "heißt"]
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) + "." for _ in range(12)]
    return "\n".join(lines) + "\n"


def addresses(seed: int = 3) -> str:
    """Address-like lines: names, house numbers, postcodes, blank lines."""
    rng = random.Random(seed)
    streets = ["Main Street", "Elm Road", "Baker St.", "Via Roma", "Rue de la Paix"]
    blocks = [f"{rng.choice(['Ann', 'Bo', 'Chen Li'])} {rng.choice(['Smith', 'Müller'])}\n"
              f"{rng.randint(1, 999)} {rng.choice(streets)}\n{rng.randint(10000, 99999)} City\n"
              for _ in range(20)]
    return "\n".join(blocks)


def wiki_like(size: int) -> str:
    """Docstring prose in wikitext's layout: `` = Heading = `` lines, `` @-@ `` joins, spaced punctuation."""
    docs = stdlib_docstrings(size)
    parts = []
    for number, doc in enumerate(docs):
        body = doc.replace("-", " @-@ ").replace(",", " ,").replace(".", " .")
        # a recurring lead sentence, as articles share stock phrases: multi-word pieces repeat
        parts.append(f" = Section {number} = \n\n This is one of the sections of the text . {body}\n\n")
    return "".join(parts)[:size]


def write_small_texts(directory: Path) -> Path:
    """The four small texts the tests use, under the shared data's names, generated."""
    directory.mkdir(parents=True, exist_ok=True)
    stories = english(4000)
    (directory / "tinystories_sample.txt").write_text(stories, encoding="utf-8")
    (directory / "corpus.en").write_text(english(130_000), encoding="utf-8")
    (directory / "german.txt").write_text(german(), encoding="utf-8")
    (directory / "address.txt").write_text(addresses(), encoding="utf-8")
    return directory


CODE_WORDS = [
    *("the", "of", "a", "to", "in", "is", "for", "with"),
    *("int", "void", "return", "if", "else", ":", "{"),
]


def code_line(rng: random.Random, words: int) -> str:
    """A line of ``words`` words drawn from a few English and C keywords."""
    return " ".join(rng.choice(CODE_WORDS) for _ in range(words)) + "\n"


def long_lines_corpus(path: Path) -> Path:
    """Long lines that repeat (a few thousand bytes, many times) and long lines that never repeat."""
    rng = random.Random(20261123)
    repeated = [code_line(rng, 600), "ab " * 700 + "\n", "x" * 3000 + "\n"]
    distinct = [code_line(rng, rng.randrange(100, 900)) for _ in range(60)]
    short = [code_line(rng, rng.randrange(1, 8)) for _ in range(400)]
    lines = repeated * 25 + distinct + short * 3
    rng.shuffle(lines)
    path.write_text("".join(lines), encoding="utf-8")
    return path


def lines_with_specials(english: str, scripts: str, specials: list[str], every: int) -> list[str]:
    """The lines of ``english`` then of ``scripts`` (newlines kept, blank ones included), every
    ``every``-th with one of ``specials`` (in turn) put in at its first space."""
    lines = english.splitlines(keepends=True) + scripts.splitlines(keepends=True)
    for index in range(0, len(lines), every):
        lines[index] = lines[index].replace(" ", f" {specials[index % len(specials)]}", 1)
    return lines
