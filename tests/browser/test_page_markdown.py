"""Markdown in the page (issue 15): rendered while it streams, sanitised like settled history,
identical to the settled render at the end (nothing moves), a reader scrolled up stays put, and
streaming costs at most twice one whole render. Layers: the page's transcript view only; the
reducer and the log are untouched."""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import BrowserContext, Page, expect

from fake_openai import FakeOpenAI, barrier, delay, reply, text
from helpers import ServerProcess
from pagekit import open_app, send, session_id_of, wait_settled

pytestmark = pytest.mark.slow

DOCUMENTS = [
    "# Title\n\nSome *emphasis* and **bold**, `code`, ~~gone~~.\n\n## Next\n\npara one\n"
    "continues\n\n---\n\nlast",
    "| left | mid | right |\n|:--|:-:|--:|\n| 1 | 2 | 3 |\n| four | five | six |\n\nafter",
    "```python\ndef f(x):\n    return x * 2\n```\n\ntext\n\n```\nunclosed fence\nstill code",
    "- a\n- b\n\n  more of b\n- c\n\n1. one\n2. two\n\n- [ ] todo\n- [x] done\n\nend",
    "> quoted\nlazy line\n#x\n\n> second\n\n# heading\npara\n===\n\nsetext\n---\n",
    "See https://example.com/path?q=1 and README.md.\n\n    indented code\n\n<b>raw</b>",
    "para\n| a | b |\n| - | - |\n| 1 | 2 |\n\n[ref]: https://example.com\n\nuse [ref] here",
    "* item\n#\n\ntext <script>window.__xss=1</script> [x](javascript:alert(1))\n",
]

EVERY_PREFIX_JS = """async (docs) => {
  const { MarkdownView } = await import('/static/js/markdown.js');
  const failures = [];
  for (const doc of docs) {
    for (const step of [1, 3, 7]) {
      const live = new MarkdownView(document.createElement('div'));
      for (let end = step; end < doc.length + step; end += step) {
        const prefix = doc.slice(0, end);
        live.show(prefix);
        const whole = new MarkdownView(document.createElement('div'));
        whole.show(prefix);
        if (live.el.innerHTML !== whole.el.innerHTML) {
          failures.push({ prefix, live: live.el.innerHTML, whole: whole.el.innerHTML });
          break;
        }
      }
    }
  }
  return failures;
}"""


def test_the_incremental_render_of_every_prefix_is_the_whole_render(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    page = context.new_page()
    open_app(page, web_server.base_url)
    assert page.evaluate(EVERY_PREFIX_JS, DOCUMENTS) == []


def settled_html(page: Page) -> str:
    return page.locator(".row.assistant .markdown").last.inner_html()


def test_a_streaming_answer_renders_live_and_settles_without_moving(
    context: BrowserContext, openai_web: ServerProcess, fake: FakeOpenAI
) -> None:
    intro = "## Plan\n\n| step | cost |\n|:--|--:|\n| one | 1 |\n\n```js\nlet x = 1;\n"
    filler = "".join(f"Paragraph {i} with **bold** words.\n\n" for i in range(40))
    fake.script(
        reply(
            text(intro),
            barrier("mid"),
            text("```\n\n" + filler),
            barrier("late"),
            text("The end."),
            barrier("finish"),
        )
    )
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    open_app(page, openai_web.base_url)
    send(page, "explain")
    live = page.locator(".row.live .markdown")
    # mid-stream: the heading, the table and the unclosed fence already render
    expect(live.locator("h2")).to_have_text("Plan")
    expect(live.locator("th.align-right")).to_have_text("cost")
    expect(live.locator(".code-block .code-lang")).to_have_text("js")
    expect(live.locator("pre code")).to_contain_text("let x = 1;")
    fake.release("mid")
    expect(live.locator("p").filter(has_text="Paragraph 39")).to_have_count(1)

    # a reader scrolls up: they stay put while output arrives, and may jump to the latest
    transcript = page.locator("#transcript")
    transcript.evaluate("(el) => { el.scrollTop = 100; }")
    page.wait_for_timeout(100)
    fake.release("late")
    expect(live.locator("p").last).to_have_text("The end.")
    jump = page.get_by_role("button", name="Jump to latest")
    expect(jump).to_be_visible()
    assert transcript.evaluate("(el) => el.scrollTop") == 100

    first_p = page.locator(".row.assistant .markdown p").first
    before = first_p.bounding_box()
    fake.release("finish")
    wait_settled(page)
    assert first_p.bounding_box() == before  # nothing moved when the run ended
    assert transcript.evaluate("(el) => el.scrollTop") == 100
    final_live = settled_html(page)
    jump.click()
    expect(jump).to_be_hidden()
    assert transcript.evaluate("(el) => el.scrollHeight - el.scrollTop - el.clientHeight") < 40

    fresh = context.new_page()
    open_app(fresh, openai_web.base_url, f"/s/{session_id_of(page)}")
    expect(fresh.locator(".row.assistant .markdown p").last).to_have_text("The end.")
    assert settled_html(fresh) == final_live  # the live render of the final text is the settled one
    assert errors == []  # no CSP violation (table alignment is a class, not a style)


BLOCK = (
    "### Section\n\nSome text with **bold**, `code` and a link https://example.com/a.\n\n"
    "- item one\n- item two\n\n| a | b |\n|:-|-:|\n| 1 | 2 |\n\n"
    "```python\nprint('hello')\nfor i in range(3):\n    print(i)\n```\n\n"
)
ANSWER = (BLOCK * (100_000 // len(BLOCK) + 1))[:100_000]  # under MAX_FORMATTED_CHARS
DELTAS = [ANSWER[i : i + 50] for i in range(0, len(ANSWER), 50)]

# The page's cadence without the server competing for the two cores: the deltas arrive
# (2,000 over about 5 s) and the live text renders every 100 ms, so every 20 deltas here
# (100 renders, twice the real rate); each round alternates a streamed and a whole render.
BUDGET_JS = """async (deltas) => {
  const { MarkdownView } = await import('/static/js/markdown.js');
  const streamed = [], whole = [];
  for (let round = 0; round < 3; round++) {
    let text = '', began = performance.now();
    const live = new MarkdownView(document.createElement('div'));
    deltas.forEach((delta, i) => {
      text += delta;
      if (i % 20 === 19) live.show(text);
    });
    live.show(text);
    streamed.push(performance.now() - began);
    began = performance.now();
    const once = new MarkdownView(document.createElement('div'));
    once.show(text);
    whole.push(performance.now() - began);
    if (live.el.innerHTML !== once.el.innerHTML) throw new Error('renders differ');
  }
  const median = (xs) => xs.sort((a, b) => a - b)[1];
  return { streamed: median(streamed), whole: median(whole) };
}"""


def test_streaming_100_kb_in_2000_deltas_costs_at_most_twice_one_render(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    assert len(DELTAS) == 2000
    page = context.new_page()
    open_app(page, web_server.base_url)
    cost = page.evaluate(BUDGET_JS, DELTAS)
    print(f"streamed {cost['streamed']:.0f} ms, whole {cost['whole']:.0f} ms")
    assert cost["streamed"] <= 2 * cost["whole"]


def test_a_100_kb_answer_streamed_through_the_server_settles_as_rendered(
    context: BrowserContext, openai_web: ServerProcess, fake: FakeOpenAI
) -> None:
    steps = []
    for i, chunk in enumerate(DELTAS):
        steps.append(text(chunk))
        if i % 10 == 9:
            steps.append(delay(0.02))  # about 5 s of streaming
    fake.script(reply(*steps))
    page = context.new_page()
    open_app(page, openai_web.base_url)
    send(page, "long answer")
    wait_settled(page, timeout=120_000)
    streamed = page.evaluate("import('/static/js/markdown.js').then((m) => m.renderStats)")
    fresh = context.new_page()
    open_app(fresh, openai_web.base_url, f"/s/{session_id_of(page)}")
    expect(fresh.locator(".row.assistant .code-block")).not_to_have_count(0)
    once = fresh.evaluate("import('/static/js/markdown.js').then((m) => m.renderStats)")
    assert settled_html(fresh) == settled_html(page)
    # measured beside a busy server, so printed; the budget is asserted above
    print(f"through the server: {streamed} vs once {once}")
    assert 20 < streamed["renders"] < 200  # it rendered while streaming, throttled


HOSTILE = (
    '**bold** <img src=x onerror="window.__xss=1"> <script>window.__xss=2</script>\n\n'
    "[js](javascript:window.__xss=3) [data](data:text/html,<b>x</b>) ![pixel](https://example.com/p.png)\n\n"
    "```html\n<script>window.__xss=4</script>\n```\n\n| a |\n|---|\n| <svg onload=x> |\n"
)

INERT_JS = """(root) => ({
  xss: window.__xss ?? null,
  active: root.querySelectorAll('script, img, svg, iframe, [onerror], [onload], [style]').length,
  hrefs: [...root.querySelectorAll('a[href]')].map((a) => a.getAttribute('href')),
  strong: root.querySelectorAll('strong').length,
})"""


def test_live_markdown_is_sanitised_like_settled_history(
    context: BrowserContext, openai_web: ServerProcess, fake: FakeOpenAI
) -> None:
    fake.script(reply(text(HOSTILE), barrier("hold")))
    page = context.new_page()
    open_app(page, openai_web.base_url)
    send(page, "go")
    live = page.locator(".row.live .markdown")
    expect(live.locator("strong")).to_have_count(1)
    during = live.evaluate(INERT_JS)
    fake.release("hold")
    wait_settled(page)
    after = page.locator(".row.assistant .markdown").evaluate(INERT_JS)
    assert during == after == {"xss": None, "active": 0, "hrefs": [], "strong": 1}
    expect(page.locator(".row.assistant .markdown code")).to_contain_text("<script>")


RICH = (
    "| left | centre | right |\n|:--|:-:|--:|\n| a | b | c |\n\n"
    "- [x] shipped\n- [ ] pending\n\n"
    "Docs at https://example.com/docs, not README.md.\n\n"
    "> a quoted line\n\n"
    "```python\nprint('hi')\n```\n\n    indented\n"
)


def test_settled_markdown_has_alignment_tasks_links_quotes_and_copyable_code(
    context: BrowserContext, openai_web: ServerProcess, fake: FakeOpenAI
) -> None:
    fake.script(reply(text(RICH)))
    context.grant_permissions(["clipboard-read", "clipboard-write"])
    page = context.new_page()
    open_app(page, openai_web.base_url)
    send(page, "show me")
    wait_settled(page)
    fresh = context.new_page()
    errors: list[str] = []
    fresh.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    open_app(fresh, openai_web.base_url, f"/s/{session_id_of(page)}")
    answer = fresh.locator(".row.assistant .markdown")
    expect(answer.locator("table")).to_be_visible()
    aligns = answer.locator("td").evaluate_all(
        "(cells) => cells.map((c) => getComputedStyle(c).textAlign)"
    )
    assert aligns == ["left", "center", "right"]
    assert answer.locator("[style]").count() == 0
    expect(answer.get_by_role("checkbox", name="Done", exact=True)).to_be_checked()
    expect(answer.get_by_role("checkbox", name="Not done")).not_to_be_checked()
    expect(answer.locator("li.task").first).to_have_text("shipped")
    expect(answer.get_by_role("link", name="https://example.com/docs")).to_have_attribute(
        "href", "https://example.com/docs"
    )
    expect(answer.locator("a")).to_have_count(1)  # README.md stays text
    quote = answer.locator("blockquote")
    assert quote.evaluate("(q) => getComputedStyle(q).borderLeftStyle") == "solid"
    heads = answer.locator(".code-head .code-lang")
    expect(heads).to_have_text(["python", "text"])
    expect(answer.locator(".code-block .hljs-built_in")).to_have_text("print")
    answer.get_by_role("button", name="Copy").first.click()
    expect(answer.get_by_role("button", name="Copied")).to_be_visible()
    assert fresh.evaluate("navigator.clipboard.readText()") == "print('hi')\n"
    assert errors == []  # no CSP violation from the table's alignment


LINE = "# heading {i}\n\n**bold** <b>raw</b> and `code` [a](https://example.com)\n\n"
HUGE = "".join(LINE.format(i=i) for i in range(60_000))[:3_000_000]
HUGE_NOTE = "Shown as plain text: 3,000,000 characters is more than the 200,000 that are formatted."

PLAIN_JS = """(el) => ({
  note: el.querySelector(':scope > p.render-note')?.textContent ?? null,
  text: el.querySelector(':scope > pre.render-plain')?.textContent ?? null,
  markup: el.querySelectorAll('h1, strong, b, code, a, .code-block').length,
  children: el.children.length,
  noteStyle: getComputedStyle(el.querySelector('.render-note') ?? el).fontStyle,
  wrap: getComputedStyle(el.querySelector('.render-plain') ?? el).whiteSpace,
})"""

# the threshold, in the module: 200,000 characters are formatted, 200,001 are not
BOUNDARY_JS = """async () => {
  const { MarkdownView, MAX_FORMATTED_CHARS } = await import('/static/js/markdown.js');
  const at = (n) => {
    const view = new MarkdownView(document.createElement('div'));
    view.show('# t\\n\\n' + 'a'.repeat(n - 5));
    return [view.el.querySelectorAll('h1').length, view.el.querySelectorAll('.render-note').length];
  };
  const back = new MarkdownView(document.createElement('div'));
  back.show('# t\\n\\n' + 'a'.repeat(MAX_FORMATTED_CHARS));
  back.show('# t\\n\\nshort');  // a text replaced by a shorter one renders as Markdown again
  return { max: MAX_FORMATTED_CHARS, at: at(MAX_FORMATTED_CHARS), over: at(MAX_FORMATTED_CHARS + 1),
           back: back.el.innerHTML };
}"""


def click_delay(page: Page) -> float:
    """Seconds from a real mouse click on the message box to the page handling it."""
    page.evaluate(
        "() => { window.__clicked = false; document.addEventListener('click', "
        "() => { window.__clicked = true; }, { once: true, capture: true }); }"
    )
    box = page.get_by_role("textbox", name="Message").bounding_box()
    assert box
    began = time.monotonic()
    page.mouse.click(box["x"] + 10, box["y"] + 10)
    page.wait_for_function("window.__clicked === true", timeout=30_000)
    return time.monotonic() - began


def test_an_answer_over_200000_characters_shows_as_plain_text_live_and_settled(
    context: BrowserContext, openai_web: ServerProcess, fake: FakeOpenAI
) -> None:
    """A 3 MB answer is not parsed as Markdown in the page (it blocked the main thread): it
    shows as plain text after a note, the same live, settled and after a reload."""
    head = 250_000  # already over the threshold at the first barrier
    rest = [HUGE[i : i + 50_000] for i in range(head, len(HUGE), 50_000)]
    fake.script(reply(text(HUGE[:head]), barrier("over"), *map(text, rest), barrier("finish")))
    page = context.new_page()
    open_app(page, openai_web.base_url)
    assert page.evaluate(BOUNDARY_JS) == {
        "max": 200_000,
        "at": [1, 0],
        "over": [0, 1],
        "back": "<h1>t</h1>\n<p>short</p>\n",
    }
    send(page, "a very long answer")
    live = page.locator(".row.live .markdown")
    expect(live.locator(".render-note")).to_have_text(
        "Shown as plain text: 250,000 characters is more than the 200,000 that are formatted."
    )
    during = live.evaluate(PLAIN_JS)
    assert during["text"] == HUGE[:head]
    assert during["markup"] == 0 and during["children"] == 2  # "# heading 0" is no <h1>
    assert during["noteStyle"] == "italic" and during["wrap"] == "pre-wrap"

    fake.release("over")
    streaming = click_delay(page)  # while 3 MB stream in
    expect(live.locator(".render-note")).to_have_text(HUGE_NOTE, timeout=60_000)
    note_box = live.locator(".render-note").bounding_box()
    fake.release("finish")
    wait_settled(page, timeout=120_000)
    answer = page.locator(".row.assistant .markdown").last
    settled = answer.evaluate(PLAIN_JS)
    assert settled["note"] == HUGE_NOTE and settled["text"] == HUGE
    assert settled["markup"] == 0 and settled["children"] == 2
    assert answer.locator(".render-note").bounding_box() == note_box  # nothing moved
    settled_at_end = click_delay(page)

    fresh = context.new_page()
    open_app(fresh, openai_web.base_url, f"/s/{session_id_of(page)}")
    reloaded = fresh.locator(".row.assistant .markdown").last
    expect(reloaded.locator(".render-note")).to_have_text(HUGE_NOTE)
    after_reload = click_delay(fresh)
    assert reloaded.evaluate(PLAIN_JS) == settled
    print(
        f"click handled in {streaming:.3f} s streaming, {settled_at_end:.3f} s settled, "
        f"{after_reload:.3f} s after a reload"
    )
    assert max(streaming, settled_at_end, after_reload) < 1.0


# the median time the layout of one more line appended to a plain text of `n` characters
# takes, and what the first part shows: as many lines as it has newlines
APPEND_LAYOUT_JS = """async ([huge, n]) => {
  const { MarkdownView } = await import('/static/js/markdown.js');
  const host = document.createElement('div');
  host.className = 'markdown';
  host.style.width = '700px';
  document.body.prepend(host);
  const view = new MarkdownView(host);
  let text = huge.slice(0, n);
  view.show(text);
  void host.offsetHeight;
  const times = [];
  for (let i = 0; i < 15; i++) {
    text += `one more line ${i}\\n`;
    view.show(text);
    const began = performance.now();
    void host.offsetHeight;
    times.push(performance.now() - began);
  }
  const pre = host.querySelector('pre.render-plain');
  const first = pre.firstElementChild;
  const shown = {
    same: pre.textContent === text,
    parts: pre.children.length,
    newlines: first.textContent.split('\\n').length - 1,
    lines: first.getBoundingClientRect().height / parseFloat(getComputedStyle(pre).lineHeight),
  };
  host.remove();
  return { ms: times.sort((a, b) => a - b)[7], ...shown };
}"""


def test_appending_to_a_3_mb_plain_text_lays_out_no_more_than_appending_to_250_kb(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """A growing plain text re-lays out only its last part (layer: the page's transcript view):
    one text node of 3 MB took 150 ms per append to lay out (16 times 250 KB's), and a click
    waited for it."""
    page = context.new_page()
    open_app(page, web_server.base_url)
    small = page.evaluate(APPEND_LAYOUT_JS, [HUGE, 250_000])
    large = page.evaluate(APPEND_LAYOUT_JS, [HUGE, 3_000_000])
    print(f"layout of one appended line: {small['ms']:.2f} ms on 250 KB, {large['ms']:.2f} on 3 MB")
    assert small["same"] and large["same"]
    assert large["parts"] > 100  # cut into parts of about 16 KB
    # a part's last newline adds no empty line at its edge
    assert large["lines"] == large["newlines"] > 100
    # A floor of 2 ms: at about 1 ms (0.9-1.7 on 250 KB here) the timer's and the layout's
    # noise made 3 MB's 2.5-4.8 ms fail now and then; the bug this catches took 150 ms.
    assert large["ms"] <= 5 * max(small["ms"], 2.0)


# the parts' lengths of a text shown whole and streamed in 1,000-character pieces, and
# whether a part ends inside a surrogate pair
PARTS_JS = """async (texts) => {
  const { MarkdownView } = await import('/static/js/markdown.js');
  const parts = (view) => [...view.el.querySelector('pre.render-plain').children]
    .map((part) => part.textContent);
  return texts.map((text) => {
    const whole = new MarkdownView(document.createElement('div'));
    whole.show(text);
    const live = new MarkdownView(document.createElement('div'));
    for (let end = 1000; end < text.length + 1000; end += 1000) live.show(text.slice(0, end));
    const [a, b] = [parts(whole), parts(live)];
    return {
      same: JSON.stringify(a) === JSON.stringify(b) && a.join('') === text,
      lengths: a.map((part) => part.length),
      split: a.some((part) => /[\\ud800-\\udbff]$/.test(part)),
    };
  });
}"""


def test_plain_parts_are_cut_the_same_streamed_or_whole_and_never_inside_a_character(
    context: BrowserContext, web_server: ServerProcess
) -> None:
    """A long line after 200 KB of short ones is cut where the whole text is cut (a newline
    far off did not count once the text was whole); a forced cut in a line of emoji falls
    between two characters, never between the halves of one."""
    page = context.new_page()
    open_app(page, web_server.base_url)
    long_line = "x" * 100_000 + "\n"
    texts = ["short line\n" * 20_000 + long_line + "tail\n" * 10, "a" + "\U0001f600" * 110_000]
    lined, emoji = page.evaluate(PARTS_JS, texts)
    assert lined["same"] and emoji["same"]
    assert max(lined["lengths"]) <= 65_536 and not emoji["split"]
    assert emoji["lengths"][0] == 65_535  # one short of the limit: a pair is not split
