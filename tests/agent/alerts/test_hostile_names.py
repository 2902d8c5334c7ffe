"""Function names and evidence a hostile target controls, through the real payload builders and AlertService to
real loopback receivers: Slack gets no control sequence but our own two links and shows names as bounded inline
code; the webhook and Alertmanager bodies carry no invisible or reordering character."""

from __future__ import annotations

import html
import re

import pytest

from agent.alerts import payloads
from analysis.regression import Cause, FunctionShift, Regression
from tests.agent.alerts.conftest import say_opened, wait_for

OURS = "http://infersight.test:9464/"
# What a target can name a function (py-spy reports them as the code object says) and make grow.
HOSTILE_FUNCTIONS = [
    "<https://evil.example/login|Open regression> (m.py)",
    "<!channel> (m.py)",
    "<!here> & <@U024BE7LH> <#C024BE7LR> <!subteam^S1|oncall> (m.py)",
    "a`b` *bold* _it_ ~s~ ``` <!everyone> (m.py)",
    "x" * 5000,
    "evil\u202etxt.exe (m.py)",
    "line\n> quote <!channel> (m.py)",
    "\x1b[31mred\x07 \u200bzw\u2066iso\u2069\u2028 (m.py)",
    "`",
    "https://evil.example/login (m.py)",
]
# Evidence can carry what the target answered (a scrape error, an unmeasured reason).
HOSTILE_EVIDENCE = ("not measured: latency: HTTP 500 <!channel> <https://evil.example|click here> & "
                    "\u202eesrever\n> quoted " + "y" * 2000)


def hostile_regressions() -> list[Regression]:
    """Two episodes: each alert shows its top five grown functions, and the list has ten."""
    out = []
    for n, names in enumerate((HOSTILE_FUNCTIONS[:5], HOSTILE_FUNCTIONS[5:])):
        out.append(Regression(
            id=f"hostile-{n}", target="workload", pid=4242, opened_at=1_800_000_000.0 + n, severity="warning",
            score=5.5, causes=[Cause("unknown", 0.0, HOSTILE_EVIDENCE), Cause("gc", 0.5, "GC <b>& more")],
            functions=[FunctionShift(name, 0.01, 0.5 - 0.01 * i) for i, name in enumerate(names)],
            baseline_start=1_799_999_000.0, baseline_end=1_799_999_900.0))
    return out


def slack_texts(doc: dict) -> list[str]:
    texts = [doc["text"]]
    for block in doc["blocks"]:
        if "text" in block:
            texts.append(block["text"]["text"])
        texts += [f["text"] for f in block.get("fields", [])] + [e["text"] for e in block.get("elements", [])]
    return texts


def check_slack(doc: dict) -> list[str]:
    """Every property a hostile name must not break; returns the function names as shown (unescaped)."""
    texts = slack_texts(doc)
    for text in texts:
        # Slack's control sequences are <...>: the only ones are our links, to the status page.
        tokens = re.findall(r"<[^>]*>", text)
        assert all(t.startswith("<" + OURS) for t in tokens), tokens
        assert all(c == "\n" or c.isprintable() for c in text), ascii(text)
        # Every & starts one of the three entities Slack decodes, so none can begin another.
        assert not re.search(r"&(?!amp;|lt;|gt;)", text), text
    links = re.findall(r"<[^>]*>", doc["blocks"][3]["elements"][0]["text"])
    assert [link.rsplit("|", 1)[1] for link in links] == ["regression>", "differential flame graph>"]
    assert len(doc["blocks"][0]["text"]["text"]) <= 150
    section = doc["blocks"][2]["text"]["text"]
    assert len(section) <= 3000
    shown = []
    for line in section.split("*Functions that grew*\n", 1)[1].splitlines():
        # A bullet, one code span with no backtick inside (so nothing after it is formatted), the shares.
        m = re.fullmatch(r"• `([^`\n]+)` \d+% → \d+%", line)
        assert m, line
        name = html.unescape(m.group(1))
        assert len(name) <= payloads.MAX_FUNCTION_CHARS
        shown.append(name)
    return shown


def check_printable(value, key: str = "") -> None:
    """No string anywhere in a JSON body has an invisible or reordering character (a description keeps its
    line breaks, which we put between causes)."""
    if isinstance(value, dict):
        for k, v in value.items():
            check_printable(v, k)
    elif isinstance(value, list):
        for v in value:
            check_printable(v, key)
    elif isinstance(value, str):
        allowed = "\n" if key == "description" else ""
        assert all(c in allowed or c.isprintable() for c in value), (key, ascii(value))


def test_slack_payload_builder_escapes_hostile_names() -> None:
    for reg in hostile_regressions():
        labels = payloads.alert_labels(reg, "gpu-7")
        ann = payloads.alert_annotations(reg, OURS.rstrip("/"), now=1_800_000_100.0)
        event = payloads.AlertEvent(fingerprint=payloads.fingerprint(labels), status="firing", labels=labels,
                                    annotations=ann, starts_at=reg.opened_at, ends_at=None,
                                    generator_url=ann["regression_url"], causes=tuple(reg.causes),
                                    functions=tuple(reg.functions))
        shown = check_slack(payloads.slack(event))
        assert len(shown) == len(reg.functions)


def test_code_span_and_escaping_rules() -> None:
    assert payloads.mrkdwn("<!channel> & <@U1|x>") == "&lt;!channel&gt; &amp; &lt;@U1|x&gt;"
    assert payloads.code("a`b<c>") == "`a\u02cbb&lt;c&gt;`"
    assert payloads.printable("a\u202eb\nc\x00\u2066") == "a\\u202eb\\x0ac\\x00\\u2066"
    assert payloads.printable("plain ünïcödé ✓ (m.py:1)") == "plain ünïcödé ✓ (m.py:1)"


def test_hostile_names_through_real_slack_and_webhook_receivers(receivers, service_for) -> None:
    slack_in, hook_in, am_in = receivers(), receivers(), receivers()
    svc = service_for([{"name": "chat", "kind": "slack", "url": slack_in.url},
                       {"name": "hook", "kind": "webhook", "url": hook_in.url},
                       {"name": "am", "kind": "alertmanager", "url": am_in.url}])
    for reg in hostile_regressions():
        say_opened(svc, reg)
    wait_for(lambda: all(len(r.accepted()) == 2 for r in (slack_in, hook_in, am_in)), what="all six deliveries")

    shown = [name for a in slack_in.accepted() for name in check_slack(a.doc)]
    section = "\n".join(a.doc["blocks"][2]["text"]["text"] for a in slack_in.accepted())
    # What the names said is still there for a person to read, as text: escaped, visible, bounded.
    assert "&lt;!channel&gt; (m.py)" in section and "&lt;https://evil.example/login|Open regression&gt;" in section
    assert "evil\\u202etxt.exe (m.py)" in shown and "a\u02cbb\u02cb *bold* _it_ ~s~ \u02cb\u02cb\u02cb" in shown[3]
    assert "line\\x0a&gt; quote" in section and "\u02cb" in shown
    assert shown[4] == "x" * (payloads.MAX_FUNCTION_CHARS - 1) + "…"
    assert "1. unknown (0.00): not measured: latency: HTTP 500 &lt;!channel&gt; &lt;https://evil.example|click " \
           "here&gt; &amp; \\u202eesrever\\x0a&gt; quoted yyy" in section

    for a in hook_in.accepted():
        check_printable(a.doc)
        description = a.doc["alerts"][0]["annotations"]["description"]
        grew = description.split("functions that grew: ", 1)[1]
        assert all(len(line) <= payloads.MAX_EVIDENCE_CHARS + 20 for line in description.splitlines()[:-1])
        assert len(grew) < payloads.MAX_FUNCTIONS * (payloads.MAX_FUNCTION_CHARS + 12)
    assert "evil\\u202etxt.exe (m.py) 1%->50%" in hook_in.accepted()[1].doc["alerts"][0]["annotations"]["description"]
    for a in am_in.accepted():
        assert a.path == "/hook/api/v2/alerts"
        check_printable(a.doc)
        assert a.doc[0]["annotations"] == next(
            h.doc["alerts"][0]["annotations"] for h in hook_in.accepted()
            if h.doc["alerts"][0]["labels"]["regression"] == a.doc[0]["labels"]["regression"])


@pytest.mark.parametrize("name", HOSTILE_FUNCTIONS)
def test_each_hostile_name_alone(name: str) -> None:
    reg = Regression(id="one", target="workload", pid=1, opened_at=1_800_000_000.0, severity="critical", score=9.0,
                     causes=[Cause("compute", 1.0, name)], functions=[FunctionShift(name, 0.0, 0.9)])
    labels = payloads.alert_labels(reg, "h")
    ann = payloads.alert_annotations(reg, OURS.rstrip("/"), now=1_800_000_100.0)
    check_printable(ann, "annotations")
    event = payloads.AlertEvent(fingerprint="f" * 16, status="firing", labels=labels, annotations=ann,
                                starts_at=reg.opened_at, ends_at=None, generator_url=OURS,
                                causes=tuple(reg.causes), functions=tuple(reg.functions))
    (shown,) = check_slack(payloads.slack(event))
    assert shown == payloads.shorten(payloads.printable(name), payloads.MAX_FUNCTION_CHARS).replace("`", "\u02cb")
