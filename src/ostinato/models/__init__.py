"""GGUF models for the experiments: synthesized from named shape specs (random weights, real architecture and
vocabulary) or downloaded with a checksum; plus the Python tokenizers matching their vocabularies."""

from ostinato.models.download import DownloadResult, download
from ostinato.models.layout import Types
from ostinato.models.spec import ModelSpec, get_spec, spec_names
from ostinato.models.synth import SynthResult, synthesize
from ostinato.models.vocab import VOCAB_KINDS, detokenize, get_tokenizer, tokenize

__all__ = [
    "DownloadResult",
    "ModelSpec",
    "SynthResult",
    "Types",
    "VOCAB_KINDS",
    "detokenize",
    "download",
    "get_spec",
    "get_tokenizer",
    "spec_names",
    "synthesize",
    "tokenize",
]

