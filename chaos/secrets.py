"""What a secret looks like, in one place: profile validation, the --chaos-workload check and
the scan of written reports all ask here, so they cannot disagree about a token or a key.
"""

from __future__ import annotations

import re
import shlex

# Key names that hold secrets, matched on words (TOKENIZERS_PARALLELISM is fine).
_SECRET_WORDS = {"password", "passwd", "passphrase", "token", "tokens", "secret", "secrets", "apikey",
                 "bearer"}
_SECRET_PAIRS = {("api", "key"), ("private", "key"), ("access", "token"), ("auth", "token"), ("client", "secret")}

# Values that are secrets whatever they are called: (scan kind, what it is, pattern).
VALUE_PATTERNS: tuple[tuple[str, str, re.Pattern], ...] = (
    ("pem-private-key", "a PEM private key", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----")),
    ("aws-access-key-id", "an AWS access key id", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
)

# What else gives a secret away in written text (logs, reports, the ledger): (scan kind, pattern).
TEXT_PATTERNS: tuple[tuple[str, re.Pattern], ...] = (
    *((kind, pattern) for kind, _, pattern in VALUE_PATTERNS),
    ("bearer-token", re.compile(r"\b[Bb]earer\s+[A-Za-z0-9\-._~+/]{16,}=*")),
    # password=value (command lines, URLs, env dumps) and "password": "value" (JSON); a
    # redacted value (***, <redacted>) is fine.
    ("password", re.compile(r"(?i)\b(?:password|passwd)\s*=[\"']?(?![*<\s&;,\"']|redacted\b)[^\s&;,\"']")),
    ("password", re.compile(r"(?i)\"(?:password|passwd)\"\s*:\s*\"(?![*<]|redacted\")[^\"]")),
)


def _words(name: str) -> list[str]:
    name = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return [w for w in re.split(r"[^A-Za-z0-9]+", name.lower()) if w]


def is_secret_name(name: str) -> bool:
    """True for names that hold secrets: password, ssh_passphrase, HF_TOKEN, apiKey, ..."""
    words = _words(name)
    return any(w in _SECRET_WORDS for w in words) or any(p in _SECRET_PAIRS for p in zip(words, words[1:]))


def secret_value_in(text: str) -> str | None:
    """What secret value ``text`` contains ("a PEM private key", ...), or None."""
    for _, what, pattern in VALUE_PATTERNS:
        if pattern.search(text):
            return what
    return None


def secret_in_command(command: str) -> str | None:
    """What looks like a secret in a command line (``HF_TOKEN=…``, ``--api-key …``, a PEM or
    AWS key), or None.  Commands end up in reports, which are meant to be shared."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    for i, word in enumerate(words):
        name, eq, value = word.partition("=")
        if eq and value and is_secret_name(name.lstrip("-")):
            return f"{name}=… (a secret-looking value)"
        if word.startswith("--") and not eq and is_secret_name(word[2:]) and i + 1 < len(words):
            return f"{word} … (a secret-looking argument)"
    return secret_value_in(command)
