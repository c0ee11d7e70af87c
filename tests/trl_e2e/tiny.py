"""Tiny, fully offline building blocks for a real ``GRPOTrainer`` run.

Everything here is built in-process: no hub access, no files read, no weights
downloaded.  The three builders are deterministic for a given ``seed``:

* :func:`make_tokenizer` -- word-level ``tokenizers`` model wrapped as a
  ``transformers.PreTrainedTokenizerFast`` (pad/eos/unk, left padding, and a
  minimal chat template in case a test wants conversational prompts).
* :func:`make_model` -- a 2-layer ``Qwen2ForCausalLM`` with hidden size 32.
* :func:`make_dataset` -- plain-text prompts with extra columns ``solution``
  (str), ``group_tag`` (str, unique per prompt) and ``prompt_id`` (int).
"""

from __future__ import annotations

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
SPECIAL_TOKENS = [PAD, EOS, UNK]

# Small closed vocabulary: every word the dataset and the chat template use.
WORDS = (
    [str(d) for d in range(10)]
    + [
        "question",
        "answer",
        "what",
        "is",
        "plus",
        "minus",
        "times",
        "the",
        "of",
        "number",
    ]
    + ["yes", "no", "maybe", "ok", "a", "b", "c", "d", "e", "f"]
    + ["user", "assistant", "system", ":", "?", ".", ","]
)

# Minimal chat template (only used when a test builds conversational prompts;
# the default harness uses plain-text prompts).  Tokens are space separated so
# the word-level pre-tokenizer maps them to vocab entries.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }} : {{ message['content'] }} "
    "{% endfor %}{% if add_generation_prompt %}assistant : {% endif %}"
)


def make_tokenizer():
    """Return a word-level ``PreTrainedTokenizerFast`` (40 tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # WordLevel has no natural decoder; join the words back with spaces.
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        truncation_side="left",
        model_max_length=128,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def make_model(tokenizer, seed: int = 0):
    """Return a tiny randomly initialised ``Qwen2ForCausalLM`` (fp32, CPU)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        use_cache=True,
    )
    # Seed only the construction, restoring the global RNG afterwards.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    return model


def make_rows(num_prompts: int = 6, conversational: bool = False) -> list[dict]:
    """Rows of the prompt dataset (as plain dicts, handy for tests)."""
    ops = ["plus", "minus", "times"]
    rows = []
    for i in range(num_prompts):
        a, b = i % 10, (3 * i + 1) % 10
        op = ops[i % 3]
        text = f"question {i % 10} : what is {a} {op} {b} ?"
        prompt = [{"role": "user", "content": text}] if conversational else text
        rows.append(
            {
                "prompt": prompt,
                "solution": f"answer {(a + b) % 10 if op == 'plus' else a}",
                "group_tag": f"grp-{i:03d}",
                "prompt_id": i,
            }
        )
    return rows


def make_dataset(num_prompts: int = 6, conversational: bool = False):
    """``datasets.Dataset`` with columns prompt, solution, group_tag, prompt_id."""
    from datasets import Dataset

    return Dataset.from_list(make_rows(num_prompts, conversational=conversational))
