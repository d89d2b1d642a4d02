"""``bytes-down``: what a round's train messages weigh as Flower 1.39 carries them.

A deployed message travels as a tree of objects (``flwr.supercore.inflatable``): the
content ``RecordDict``, each record, each ``Array`` and its ``ArrayChunk``s, each deflated to
a header (type, child ids, body length) and a body; a SuperNode pulls every distinct object
of its message's tree once. This sums ``len(obj.deflate())`` over those objects per message,
so the figure is the serialized content itself, measured, not a count of parameters. The
message's metadata (about 100 bytes, sent in the pull reply) and gRPC/TLS framing are not
counted. Records shared by the round's messages (the global model) are deflated once per
call, and counted once per message, as each node pulls them.
"""

from __future__ import annotations

from collections.abc import Iterable

from flwr.app import Message
from flwr.supercore.inflatable.inflatable_object import InflatableObject, no_object_id_recompute


def content_bytes(messages: Iterable[Message]) -> int:
    """The serialized bytes of the messages' contents: per message, every distinct object
    of its content tree, deflated (an error message or one without content: 0)."""
    seen: dict[int, dict[str, int]] = {}  # by Python id: {object id: deflated size} of a subtree

    def tree(obj: InflatableObject) -> dict[str, int]:
        got = seen.get(id(obj))
        if got is None:
            got = {}
            for child in (obj.children or {}).values():
                got.update(tree(child))
            got[obj.object_id] = len(obj.deflate())
            seen[id(obj)] = got
        return got

    with no_object_id_recompute():  # each object's id is hashed once, not per parent
        return sum(sum(tree(m.content).values()) for m in messages if m.has_content())
