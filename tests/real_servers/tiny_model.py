"""Build a tiny Llama for `transformers serve`, entirely locally (no hub access): a word-level
tokenizer trained here on a few sentences, and a model whose weights make it a deterministic
bigram machine, so the tests know what it will say.

Every layer's output projections are zero, so the residual stream is the current token's
embedding (one-hot); the final norm keeps it one-hot; `lm_head` is a transition table:
greedy decoding picks `NEXT[token]`. Two behaviours:

* `stops`: anything -> "hello" -> "world" -> "</s>": answers "hello world" and stops.
* `endless`: anything -> "more" -> "more" -> ...: never stops (the token limit ends it).
* `tools`: favours a tool call: asked anything, it calls `list_files` (the
  `<tool_call>{json}</tool_call>` form `transformers serve` parses with the tokenizer's
  `response_template`); given a tool result (the chat template then ends in `<|answer|>`),
  it answers "hello world".

Run with the transformers virtualenv's interpreter: ``python tiny_model.py OUT_DIR`` writes
``OUT_DIR/stops`` and ``OUT_DIR/endless``.
"""

from __future__ import annotations

import sys
from pathlib import Path

SPECIAL = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>"]
SPECIAL += ["<|answer|>"]  # the tool-call tags are words: decoding must keep them
CALL = '<tool_call> {"name": "list_files", "arguments": {}} </tool_call>'
CORPUS = [
    CALL,
    "hello world",
    "more words and more words",
    "the answer is here",
    "tell me something long",
    "write a long story about the sea",
]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|> "
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] %}{% for part in message['content'] %}{{ part['text'] }}"
    "{% endfor %}{% endif %} <|end|> {% endfor %}{% if add_generation_prompt %}"
    "{% if messages[-1]['role'] == 'tool' %}<|answer|> {% else %}<|assistant|> {% endif %}"
    "{% endif %}"
)
RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor_pattern": r"<\|(?:assistant|answer)\|>\s*",
    "fields": {
        "tool_calls": {
            "open_pattern": r"\s*<tool_call>",
            "close": "</tool_call>",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"\s*</s>", "content": "text"},
    },
}
CALL_WORDS = CALL.split()
CHAINS = {
    "stops": {"hello": "world", "world": "</s>"},
    "endless": {"more": "more"},
    "tools": {
        **dict(zip(CALL_WORDS, [*CALL_WORDS[1:], "</s>"], strict=True)),
        "<|answer|>": "hello",
        "hello": "world",
        "world": "</s>",
    },
}
FIRST = {"stops": "hello", "endless": "more", "tools": CALL_WORDS[0]}


def build(out: Path, kind: str) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import (
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )

    raw = Tokenizer(models.WordLevel(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    raw.train_from_iterator(CORPUS, trainers.WordLevelTrainer(special_tokens=SPECIAL))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<unk>",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    if kind == "tools":
        tokenizer.response_template = RESPONSE_TEMPLATE
    vocab = tokenizer.get_vocab()
    size = max(vocab.values()) + 1
    hidden = 8 * (-(-size // 8))
    config = LlamaConfig(
        vocab_size=size,
        hidden_size=hidden,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        max_position_embeddings=8192,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=vocab["<s>"],
        eos_token_id=vocab["</s>"],
        pad_token_id=vocab["<unk>"],
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    nxt = {vocab[a]: vocab[b] for a, b in CHAINS[kind].items()}
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
        for token in range(size):
            model.model.embed_tokens.weight[token, token] = 1.0
        model.model.norm.weight.fill_(1.0)
        model.lm_head.weight.zero_()
        for token in range(size):
            model.lm_head.weight[nxt.get(token, vocab[FIRST[kind]]), token] = 10.0
    model.generation_config = GenerationConfig(
        do_sample=False,
        bos_token_id=vocab["<s>"],
        eos_token_id=vocab["</s>"],
        pad_token_id=vocab["<unk>"],
        max_new_tokens=256,
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


if __name__ == "__main__":
    for name in CHAINS:
        build(Path(sys.argv[1]) / name, name)
