"""Prompt sets: the deployment guide's bank customer-service dialogue turns, or synthetic prompts of an exact
token count (needs the served model's tokenizer: a ``tokenizer.json`` or a model directory holding one).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from atlasctl.errors import UsageError

# Customer-service turns of the kind the deployment guide benchmarked (one dialogue turn per request).
CUSTOMER_SERVICE = (
    "Hello, I would like to check the balance of my savings account. Can you help me?",
    "I lost my debit card yesterday and I need to block it right away. What should I do?",
    "Can I increase the daily withdrawal limit on my card, and is there a fee for it?",
    "I do not recognise a payment of 49.90 euros on my credit card statement from last Tuesday.",
    "How do I reset my online banking password if I no longer have access to my old phone number?",
    "What is the interest rate for a fixed term deposit of twelve months, and can I withdraw early?",
    "I want to transfer money to an account abroad. Which details of the receiving bank do you need?",
    "Is there a fee for sending a transfer in another currency, and how is the exchange rate set?",
    "I would like to apply for a personal loan of ten thousand euros. What documents do I need?",
    "When will my salary be credited to my account if my employer pays on a Friday evening?",
    "Please update my home address and my phone number; I moved to another city last month.",
    "My mortgage payment failed this month because of insufficient funds. What happens now?",
    "Can I open a savings account for my daughter, who is twelve years old, online?",
    "Why was my card declined at a shop abroad although I have enough money on my account?",
    "How can I set up a standing order for my rent on the first working day of every month?",
    "I received a text message asking me to confirm my card number. Is this really from the bank?",
)


@dataclass(frozen=True)
class Prompt:
    text: str
    tokens: int | None  # exact count by the tokenizer, None when none was given


class TokenCounter:
    """Wraps a `tokenizers` tokenizer loaded from tokenizer.json (no transformers needed)."""

    def __init__(self, path: str | Path):
        file = Path(path)
        if file.is_dir():
            file = file / "tokenizer.json"
        if not file.is_file():
            raise UsageError(f"tokenizer {path} not found (no tokenizer.json there)",
                             fix="pass --tokenizer MODEL_DIR or .../tokenizer.json of the served model")
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:  # pragma: no cover - the controller venv has it
            raise UsageError("exact token counts need the `tokenizers` package",
                             fix="pip install tokenizers into the controller venv") from exc
        self.tokenizer = Tokenizer.from_file(str(file))
        self.path = file

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def special_ids(self) -> set[int]:
        return {tid for tok, tid in self.tokenizer.get_vocab(with_added_tokens=True).items()
                if tok in {a.content for a in self.tokenizer.get_added_tokens_decoder().values()}}


def customer_service(n: int, counter: TokenCounter | None = None, seed: int = 0) -> list[Prompt]:
    """``n`` prompts cycling through the built-in set (shuffled by ``seed``)."""
    order = list(CUSTOMER_SERVICE)
    random.Random(seed).shuffle(order)
    return [Prompt(t, counter.count(t) if counter else None) for t in (order[i % len(order)] for i in range(n))]


def synthetic(n: int, input_len: int, counter: TokenCounter, seed: int = 0) -> list[Prompt]:
    """``n`` prompts of exactly ``input_len`` tokens (re-tokenised until stable, as vLLM's random set does)."""
    if input_len < 1:
        raise UsageError(f"--input-len {input_len} must be at least 1")
    rng = random.Random(seed)
    vocab = _stable_words(counter) or sorted(
        set(range(counter.tokenizer.get_vocab_size(with_added_tokens=False))) - counter.special_ids())
    out = []
    for _ in range(n):
        out.append(_exact_prompt(rng, vocab, input_len, counter))
    return out


def _stable_words(counter: TokenCounter) -> list[int]:
    """Token ids that decode to " <letters>" and re-encode to themselves: any sequence of them keeps its
    length through decode/encode (byte-level pre-tokenisers split before each space)."""
    words = []
    for tid in sorted(set(range(counter.tokenizer.get_vocab_size(with_added_tokens=False))) - counter.special_ids()):
        text = counter.tokenizer.decode([tid])
        if len(text) > 1 and text[0] == " " and text[1:].isalpha() and text[1:].isascii():
            if counter.tokenizer.encode(text, add_special_tokens=False).ids == [tid]:
                words.append(tid)
    return words if len(words) >= 16 else []


def _exact_prompt(rng: random.Random, vocab: list[int], input_len: int, counter: TokenCounter) -> Prompt:
    ids = [rng.choice(vocab) for _ in range(input_len)]
    text = ""
    for _ in range(20):
        text = counter.tokenizer.decode(ids, skip_special_tokens=True)
        got = counter.tokenizer.encode(text, add_special_tokens=False).ids
        if len(got) == input_len:
            return Prompt(text, input_len)
        # Merges changed the count: trim or pad the re-encoded ids and try again.
        ids = got[:input_len] + [rng.choice(vocab) for _ in range(max(0, input_len - len(got)))]
    return Prompt(text, counter.count(text))
