"""Canonical form, detectors, templater, registry."""

from __future__ import annotations

import random
import string

import pytest
from hypothesis import given, settings, strategies as st

from agent_cache.errors import StoreUnavailableError, TemplateError
from agent_cache.templates import (
    TemplateMode, TemplateRegistry, Templater, canonicalize, extract_volatile, render, variables_from_prompt,
)
from agent_cache.templates.canonical import canonical_text

FAST = settings(max_examples=60, deadline=None)

TOOLS = [
    {"type": "function", "function": {"name": n, "description": f"tool {n}",
                                      "parameters": {"type": "object", "properties": {"q": {"type": "string"}, "k": {"type": "integer"}}, "required": ["q"]}}}
    for n in ("search", "lookup", "finish")
]


def _shuffled(obj, rng):
    if isinstance(obj, dict):
        items = list(obj.items())
        rng.shuffle(items)
        return {k: _shuffled(v, rng) for k, v in items}
    if isinstance(obj, list):
        return [_shuffled(v, rng) for v in obj]
    return obj


def _sys(date: str, rid: str, email: str, ts: str, body: str = "Answer carefully.") -> list[dict]:
    return [{"role": "system", "content": f"Today is {date}. Request {rid}. Contact {email}. Epoch {ts}.\n{body}"},
            {"role": "user", "content": "What is 2+2?"}]


# --- detectors ---------------------------------------------------------------

@pytest.mark.parametrize("text,kind", [
    ("2026-12-02", "date"), ("2026-12-02T14:03:00Z", "date"), ("2026-12-02 14:03+01:00", "date"),
    ("Wed, 02 Dec 2026 14:03:00 +0000", "date"), ("December 2, 2026", "date"), ("Dec 2, 2026", "date"),
    ("2 December 2026", "date"), ("12/02/2026", "date"), ("14:03", "time"), ("2:03 PM PST", "time"),
    ("1764684000", "timestamp"), ("1764684000123", "timestamp"),
    ("8f2c1a2b-1234-4abc-9def-0123456789ab", "uuid"), ("8f2c9a1b7e3d4f5a", "hex"),
    ("req_8f2cA91bZ77q0KxPq3Lm9", "id"), ("alice@example.com", "email"),
])
def test_detector_examples(text, kind):
    tmpl, values = extract_volatile(f"see {text} now.")
    assert tmpl == f"see {{{kind}_1}} now."
    assert values == {f"{kind}_1": text}


@pytest.mark.parametrize("text", ["Python 3.11.7", "we have 42 apples and 1234567 pears", "cafe", "deadbeef",
                                  "search_documents_v2_tool", "verse 3:16", "call 12345", "1.2.3.4"])
def test_false_positive_guards(text):
    assert extract_volatile(text) == (text, {})


def test_variables_and_braces():
    tmpl, values = extract_volatile("Hi Alice, JSON {\"a\": 1}. Alice again.", {"user_name": "Alice"})
    assert tmpl == 'Hi {user_name}, JSON {{"a": 1}}. {user_name} again.'
    assert values == {"user_name": "Alice"}
    assert render(tmpl, values) == 'Hi Alice, JSON {"a": 1}. Alice again.'
    with pytest.raises(TemplateError) as e:
        extract_volatile("x", {"user_name": ""})
    assert "user_name" in e.value.field


_volatile = st.one_of(
    st.builds(lambda y, m, d: f"{y}-{m:02d}-{d:02d}", st.integers(2000, 2099), st.integers(1, 12), st.integers(1, 28)),
    st.uuids().map(str), st.integers(1_000_000_000, 4_000_000_000).map(str),
    st.from_regex(r"[a-z]{3,8}@[a-z]{3,8}\.com", fullmatch=True),
)
_plain = st.text(alphabet=string.ascii_letters + " .,:{}\n\t\r" + "éü", max_size=40)


@FAST
@given(st.lists(st.tuples(_plain, _volatile), max_size=5), _plain)
def test_lossless(pairs, tail):
    text = "".join(f"{p} {v} " for p, v in pairs) + tail
    canon = canonical_text(text)
    tmpl, values = extract_volatile(canon)
    assert render(tmpl, values) == canon


# --- canonical form ----------------------------------------------------------

def test_canonical_examples():
    msgs = [{"role": "system", "content": "e\u0301 line  \r\nnext\t\rend "},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "user", "content": [{"type": "text", "text": "x "}, {"type": "image_url", "image_url": {"url": "u"}}]}]
    out, tools = canonicalize(msgs, _shuffled(TOOLS, random.Random(1)))
    assert out[0]["content"] == "\u00e9 line\nnext\nend"
    assert out[1]["content"] == "a\nb"
    assert out[2]["content"] == [{"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": "u"}}]
    assert [t["function"]["name"] for t in tools] == ["finish", "lookup", "search"]
    _, unsorted = canonicalize([], TOOLS, sort_tools=False)
    assert [t["function"]["name"] for t in unsorted] == ["search", "lookup", "finish"]


@pytest.mark.parametrize("messages,tools,field", [
    ([{"role": "robot", "content": "x"}], None, "messages[0].role"),
    ([{"role": "user", "content": "x"}, {"role": "user", "content": 5}], None, "messages[1].content"),
    ([{"role": "user", "content": [{"type": "text"}]}], None, "messages[0].content[0].text"),
    ([], [{"type": "function", "function": {"description": "d"}}], "tools[0].function.name"),
    ([], [TOOLS[0], {"type": "function", "function": {"name": "x", "parameters": {"a": {1, 2}}}}], "tools[1].function.parameters.a"),
])
def test_bad_input_names_field(messages, tools, field):
    with pytest.raises(TemplateError) as e:
        Templater("templatize").normalize(messages, tools)
    assert e.value.field == field


# --- templater properties ----------------------------------------------------

@FAST
@given(st.sampled_from(list(TemplateMode)), st.sampled_from(["system_suffix_message", "first_user_prefix"]),
       _volatile, _volatile, _plain)
def test_idempotent(mode, pos, v1, v2, body):
    t = Templater(mode, values_position=pos)
    msgs = [{"role": "system", "content": f"Now {v1} for {v2}. {body}"}, {"role": "user", "content": "hi"}]
    once = t.normalize(msgs, TOOLS)
    twice = t.normalize(once.messages, once.tools)
    assert twice == once


@FAST
@given(st.integers(0, 10**6), st.integers(0, 10**6))
def test_volatile_values_share_one_id_and_tool_order_does_not_matter(s1, s2):
    r1, r2 = random.Random(s1), random.Random(s2)
    t = Templater("templatize")
    a = t.normalize(_sys("2026-12-02 14:03", f"req_{s1:07d}aZ9xQ{s1 % 97}bC1d2E3", f"u{s1}@ex.com", "1764684000"),
                    _shuffled(r1.sample(TOOLS, 3), r1))
    b = t.normalize(_sys("Dec 3, 2027", f"req_{s2:07d}aZ9xQ{s2 % 97}bC1d2E3", f"u{s2}@ex.com", "1864684000"),
                    _shuffled(r2.sample(TOOLS, 3), r2))
    assert a.template_id == b.template_id
    assert a.template_tokens == b.template_tokens > 0
    # Canonical mode groups sessions whose only difference is tool order / key order.
    c = Templater("canonical")
    assert c.normalize(_sys("d", "r", "e", "t"), _shuffled(TOOLS, r1)).template_id == \
        c.normalize(_sys("d", "r", "e", "t"), _shuffled(TOOLS[::-1], r2)).template_id


@FAST
@given(st.text(alphabet=string.ascii_letters + " ", min_size=1, max_size=30),
       st.text(alphabet=string.ascii_letters + " ", min_size=1, max_size=30))
def test_real_content_never_shares_id(b1, b2):
    if canonical_text(b1) == canonical_text(b2):
        return
    for mode in TemplateMode:
        t = Templater(mode)
        assert t.normalize(_sys("2026-12-02", "r", "e", "t", b1)).template_id != \
            t.normalize(_sys("2026-12-02", "r", "e", "t", b2)).template_id


def test_tenant_namespacing_and_modes():
    msgs = _sys("2026-12-02 14:03", "x", "a@b.com", "1764684000")
    ids = {Templater("canonical", tenant=t).normalize(msgs).template_id for t in ("a", "b")}
    assert len(ids) == 2 and all(i.startswith("t_") and len(i) == 18 for i in ids)
    off = Templater("off").normalize(msgs)
    assert off.messages == msgs and off.values == {}
    tz = Templater("templatize").normalize(msgs)
    assert tz.messages[0]["content"].startswith("Today is {date_1}.")
    assert tz.messages[1] == {"role": "system", "content": "Session context:\ndate_1 = 2026-12-02 14:03\n"
                              "email_1 = a@b.com\ntimestamp_1 = 1764684000"}
    assert tz.messages[2] == msgs[1]
    up = Templater("templatize", values_position="first_user_prefix").normalize(msgs)
    assert len(up.messages) == 2 and up.messages[1]["content"].endswith("\n\nWhat is 2+2?")
    assert up.template_id == tz.template_id


def test_freeze_values():
    t = Templater("templatize", freeze_values=True)
    a = t.normalize(_sys("2026-12-02 14:03", "x", "a@b.com", "1764684000"), session_id="s1")
    b = t.normalize(_sys("2026-12-02 14:04", "x", "a@b.com", "1764684060"), session_id="s1")
    c = t.normalize(_sys("2026-12-02 14:04", "x", "a@b.com", "1764684060"), session_id="s2")
    assert b.messages == a.messages and b.values["date_1"] == "2026-12-02 14:03"
    assert c.values["date_1"] == "2026-12-02 14:04"
    assert Templater("templatize").normalize(_sys("2026-12-02 14:04", "x", "a@b.com", "1"), session_id="s1").values["date_1"].endswith("14:04")


def test_variables_from_langchain_prompt():
    from langchain_core.prompts import ChatPromptTemplate

    prompt = ChatPromptTemplate.from_messages([("system", "You help {user_name} on {day}."), ("human", "{question}")])
    inputs = {"user_name": "Alice", "day": "Monday", "question": "Hi Alice"}
    vars_ = variables_from_prompt(prompt, inputs)
    assert vars_ == {"user_name": "Alice", "day": "Monday"}
    msgs = [{"role": m.type.replace("human", "user"), "content": m.content} for m in prompt.invoke(inputs).to_messages()]
    out = Templater("templatize", variables=vars_).normalize(msgs)
    assert out.messages[0]["content"] == "You help {user_name} on {day}."
    assert out.messages[2]["content"] == "Hi Alice"  # conversation turns are left alone


# --- registry ----------------------------------------------------------------

class DictStore:
    """Test scaffolding implementing the TemplateStore protocol."""

    def __init__(self):
        self.d = {}
        self.writes = 0

    def record_template(self, tenant, template_id, token_length, session_id, now):
        self.writes += 1
        e = self.d.setdefault((tenant, template_id), {"first_seen": now, "sessions": set(), "token_length": token_length})
        if session_id is not None:
            e["sessions"].add(session_id)

    def template_info(self, tenant, template_id):
        e = self.d.get((tenant, template_id))
        return None if e is None else {**e, "sessions": len(e["sessions"])}


def test_registry():
    store = DictStore()
    clock = iter(range(100, 200))
    reg = TemplateRegistry(store, clock=lambda: float(next(clock)), flush_delay=60)
    t = Templater("templatize", tenant="acme")
    for s in ("s1", "s1", "s2"):  # as the front doors do: normalise, then record the served prompt
        p = t.normalize(_sys("2026-12-02", "r", f"{s}@b.com", "1764684000"), session_id=s)
        reg.record("acme", p, s)
    # normalising did no I/O: the records wait for the background flush
    assert store.writes == 0 and reg.pending() == 2
    reg.flush()
    assert reg.pending() == 0
    assert reg.info("acme", p.template_id) == {"first_seen": 100.0, "sessions": 2, "token_length": p.template_tokens}
    assert store.writes == 2  # repeated calls of a session do not write again
    assert reg.text("acme", p.template_id) is None and reg.info("other", p.template_id) is None
    reg2 = TemplateRegistry(DictStore(), store_text=True)
    reg2.record("default", Templater("canonical").normalize(_sys("d", "r", "e", "t")))
    assert reg2.text("default", Templater("canonical").normalize(_sys("d", "r", "e", "t")).template_id)
    reg.close()
    reg2.close()


class DownStore(DictStore):
    """A store that is unreachable until ``up`` is set."""

    up = False

    def record_template(self, *args):
        if not self.up:
            raise StoreUnavailableError("store down")
        super().record_template(*args)


def test_registry_keeps_records_queued_while_the_store_is_down_and_writes_them_after():
    store = DownStore()
    reg = TemplateRegistry(store, flush_delay=60, max_pending=3)
    t = Templater("templatize")
    prompts = [t.normalize(_sys("2026-12-02", "r", "e", "t"), session_id=f"s{i}") for i in range(5)]
    for i, p in enumerate(prompts):
        reg.record("default", p, f"s{i}")
    reg.flush()  # fails quietly: bookkeeping never fails a call
    assert reg.pending() == 3  # bounded: the two oldest were dropped
    store.up = True
    reg.flush()
    assert reg.pending() == 0 and store.writes == 3
    assert reg.info("default", prompts[0].template_id)["sessions"] == 3  # s2, s3, s4
    reg.close()


def test_registry_over_the_memory_store_writes_at_once():
    from agent_cache.store import MemoryStore

    store = MemoryStore()
    reg = TemplateRegistry(store)
    p = Templater("canonical").normalize(_sys("d", "r", "e", "t"), session_id="s1")
    reg.record("default", p, "s1")
    assert reg.pending() == 0 and store.template_info("default", p.template_id)["sessions"] == 1
