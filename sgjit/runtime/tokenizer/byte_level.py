"""A byte-level tokenizer with no merges (one token a byte, plus ChatML control tokens), built in
memory: the fallback tokenizer of random-weight model shapes where the bundled model's package is
not installed (e.g. on a benchmark machine). Speed does not depend on the tokenizer."""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from sgjit.runtime.tokenizer.tokenizer import Tokenizer as SgjitTokenizer

CONTROL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def byte_alphabet() -> list[str]:
    """GPT-2's byte -> printable character map, in byte order."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping, extra = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return [mapping[b] for b in range(256)]


def byte_level_tokenizer(vocab_size: int = 0) -> SgjitTokenizer:
    """Ids past the 256 bytes and the control tokens, up to `vocab_size`, decode to a word each
    (" t<id>"); encoding never produces them (no merges). So a random-weight model, which draws ids
    from its whole vocabulary, streams text at every token as a real model does."""
    alphabet = byte_alphabet()
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab.update({t: len(alphabet) + j for j, t in enumerate(CONTROL)})  # ids 256.. before the fillers
    first_filler = len(alphabet) + len(CONTROL)
    space = alphabet[ord(" ")]
    vocab.update({f"{space}t{i}": i for i in range(first_filler, vocab_size)})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CONTROL])
    ids = {t: backend.token_to_id(t) for t in CONTROL}
    return SgjitTokenizer(
        backend,
        bos_token_id=ids["<|im_start|>"],
        eos_token_ids=(ids["<|im_end|>"],),
        add_bos=False,
        chat_template=None,  # ChatML fallback
    )
