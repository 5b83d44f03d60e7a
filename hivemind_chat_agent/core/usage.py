"""The `usage` the OpenAI fronts report, counted by one stated rule, no I/O.

An OVOS hub has no tokenizer of a model, so the count is this one, the same for the prompt and
the completion: a token is a run of letters, digits or underscores (`\\w+`), or one other
non-space character (each punctuation mark, each emoji). "Hello, world!" is 4 tokens. It is
close to (usually a little under) what OpenAI's tokenizers count for English prose, and it is
what clients that show or budget tokens (LibreChat, LiteLLM, n8n) read.

The prompt is every message's text as the request sent it (all roles, content parts' text
joined); the completion is the answer as sent.
"""
import re
from typing import Any, Dict, Iterable

_TOKEN = re.compile(r"\w+|[^\w\s]")


def count_tokens(text: str) -> int:
    return sum(1 for _ in _TOKEN.finditer(text))


def usage(prompt_texts: Iterable[str], completion: str) -> Dict[str, Any]:
    """OpenAI's chat completions `usage` object for these prompt texts and this answer."""
    prompt = sum(count_tokens(t) for t in prompt_texts)
    done = count_tokens(completion)
    return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}
