"""Credentials inside URLs, masked wherever a URL is shown.

A package index URL may carry its login: ``https://user:token@host/simple``. Whatever shows text that
may hold such a URL (inventory output, dry runs, error messages, installer output) passes it through
:func:`mask_url_credentials` first; :func:`mask_credentials_in` does the same for a whole JSON
document. The URL itself reaches the installer through its environment, never its command line
(orchestrator/steps/envsync).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

#: what the user-information part of a URL becomes when shown
MASKED_USERINFO = "***"

# scheme://USERINFO@ : everything of the authority up to its last "@" (a password may hold an
# unencoded "@"; pip and urllib split at the last one too), never past the path, query or a space
_USERINFO_RE = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/\s?#'\"<>]*)@")


def mask_url_credentials(text: str) -> str:
    """``text`` with the user and password of every URL in it replaced by ``***``.

    ``https://user:pass@host/simple`` -> ``https://***@host/simple``; ``https://TOKEN@host/`` ->
    ``https://***@host/`` (a lone user field is often the token itself). Anything else is unchanged.
    """
    if "@" not in text:
        return text
    return _USERINFO_RE.sub(lambda m: f"{m.group('scheme')}{MASKED_USERINFO}@", text)


def strip_url_credentials(text: str) -> str:
    """``text`` with the user and password of every URL in it removed (``https://host/simple``):
    where only the host matters (can a node reach it?) and the login must not travel."""
    if "@" not in text:
        return text
    return _USERINFO_RE.sub(lambda m: m.group("scheme"), text)


#: how the usual API tokens begin (Hugging Face, GitHub, OpenAI-style, Slack, AWS key ids, GitLab, JWTs)
_TOKEN_PREFIXES = (
    "hf_",
    "ghp_",
    "gho_",
    "ghs_",
    "github_pat_",
    "sk-",
    "sk_",
    "xox",
    "AKIA",
    "ASIA",
    "glpat-",
    "eyJ",
)


def looks_like_token(word: str) -> bool:
    """Whether ``word`` has a secret token's shape: a usual token's start, or 20 characters or more of
    letters, digits, ``_`` and ``-`` with both letters and digits in them. A line that would repeat such
    a word is not printed (a typo's refusal, a suggested command): better a line less than a token
    shown."""
    if word.startswith(_TOKEN_PREFIXES):
        return True
    plain = re.fullmatch(r"[A-Za-z0-9_-]{20,}", word) is not None
    return plain and any(c.isdigit() for c in word) and any(c.isalpha() for c in word)


def has_url_credentials(text: str) -> bool:
    """Does ``text`` hold a URL with a user or password in it?"""
    return mask_url_credentials(text) != text


def mask_credentials_in(value: Any) -> Any:
    """A copy of a JSON-like document (dicts, lists, strings) with :func:`mask_url_credentials`
    applied to every string."""
    if isinstance(value, str):
        return mask_url_credentials(value)
    if isinstance(value, dict):
        return {key: mask_credentials_in(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [mask_credentials_in(item) for item in value]
    return value


def maskable(secrets: Iterable[str]) -> list[str]:
    """The secrets a page masks, as it masks them: longest first (one that holds another is masked
    whole), none shorter than 4 characters (a one-letter value would mask every such letter)."""
    return sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True)


def mask_secrets(text: str, secrets: Sequence[str]) -> str:
    """``text`` with each of ``secrets`` (:func:`maskable`'s list) and URL credentials masked."""
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, MASKED_USERINFO)
    return mask_url_credentials(text)
