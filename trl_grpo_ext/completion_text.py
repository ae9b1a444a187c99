"""The text of prompt and completion messages, as TRL passes them: a plain string or a list of chat messages."""


def message_text(completion: object) -> str:
    """The text of one completion, or "" when there is none.

    Args:
        completion: a plain string, or a conversational completion: a list of messages (dicts) of which the last
            one's ``"content"`` is used (a string, or a list of ``{"type": "text", "text": ...}`` parts), or a
            single message dict. Anything else (None, bytes, a message without ``"content"``) gives "".

    Returns:
        The completion text; never raises.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion:
        completion = completion[-1]
    content = completion.get("content") if isinstance(completion, dict) else None
    if isinstance(content, list):
        parts = [part.get("text") for part in content if isinstance(part, dict)]
        content = "".join(part for part in parts if isinstance(part, str))
    return content if isinstance(content, str) else ""
