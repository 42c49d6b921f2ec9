"""The chat page in a real headless Chromium against a real server: streamed replies, stop, regenerate,
edit, multi-turn, errors, code blocks."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import httpx
import pytest
import torch
from api_testing import chat_tokenizer, served_tiny, start_server, tiny_model, wait_idle

from portachat.serve.api import chat_page_html

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def test_page_is_one_offline_file():
    html = chat_page_html()
    assert "<script>" in html and "v1/chat/completions" in html
    # No CDN, no external fetches: every URL the page names is relative to the server.
    assert not re.search(r"""(src|href)\s*=\s*["']https?://""", html)
    assert "https://" not in html and "http://" not in html


def test_every_page_string_has_a_chinese_translation():
    html = chat_page_html()
    table = html[html.index("const STRINGS = {"):html.index("function pickLanguage")]
    en, zh = table[table.index("en: {"):table.index("zh: {")], table[table.index("zh: {"):]
    keys = {lang: set(re.findall(r'"([\w.-]+)":', text)) for lang, text in (("en", en), ("zh", zh))}
    assert {"docs", "docs.sources", "docs.upload"} <= keys["en"]
    assert keys["en"] == keys["zh"]
    used = set(re.findall(r'data-i18n(?:-placeholder|-title)?="([\w.-]+)"', html)) | set(re.findall(r'\bt\("([\w.-]+)"', html))
    assert used <= keys["en"], used - keys["en"]


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.is_file():
        message = f"{CHROMIUM} not found: apt-get install chromium (.ci/run does this)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS, headless=True)
        yield browser
        browser.close()


def long_winded_model(tok):
    """A random tiny model that never ends its turn on its own, so a reply streams until max_tokens."""
    model = tiny_model(tok.vocab_size)
    with torch.no_grad():
        for stop_id in tok.stop_ids:  # logit 0 among random logits of spread ~5: probability ~1e-7
            model.lm_head.weight[stop_id] = 0.0
    return model


@pytest.mark.slow
def test_chat_page_streams_stops_regenerates_and_edits(small_tokenizer, browser):
    tok = chat_tokenizer(small_tokenizer)
    server = start_server(served_tiny(tok, max_model_len=2048, model=long_winded_model(tok)))
    page = browser.new_page()
    bodies: list[dict] = []
    page.on("request", lambda r: bodies.append(json.loads(r.post_data)) if r.method == "POST" else None)
    try:
        page.goto(server.url + "/")
        page.wait_for_function("document.querySelector('[data-testid=model]').textContent === 'tiny'")
        page.click("[data-testid=toggle-settings]")
        page.fill("[data-testid=max-tokens]", "1500")
        page.fill("[data-testid=temperature]", "0.8")

        # A streamed reply: text appears while the reply is still streaming.
        page.fill("[data-testid=input]", "Hello there")
        page.keyboard.press("Enter")
        streaming = "[data-testid=message][data-role=assistant][data-status=streaming]"
        page.wait_for_function(
            f"(() => {{ const m = document.querySelector('{streaming} [data-testid=content]');"
            " return m && m.textContent.length > 5; })()", timeout=30_000)
        assert page.is_visible("[data-testid=stop]") and not page.is_visible("[data-testid=send]")

        # Stop it: the partial reply stays, marked stopped; the server frees the request.
        page.click("[data-testid=stop]")
        stopped = page.wait_for_selector("[data-testid=message][data-role=assistant][data-status=stopped]")
        partial = stopped.inner_text()
        assert page.is_visible("[data-testid=send]")
        wait_idle(server.url)
        assert page.inner_text("[data-testid=message][data-role=assistant]") == partial  # no more tokens came

        # Regenerate with a short max_tokens: one assistant reply, finished, new text.
        page.fill("[data-testid=max-tokens]", "12")
        page.click("[data-testid=regenerate]")
        page.wait_for_selector("[data-testid=message][data-role=assistant][data-status=done]", timeout=30_000)
        assert page.locator("[data-testid=message][data-role=assistant]").count() == 1
        assert bodies[-1]["messages"] == [{"role": "user", "content": "Hello there"}]
        assert bodies[-1]["max_tokens"] == 12 and bodies[-1]["stream"] is True

        # Multi-turn: the second question carries the first exchange.
        page.fill("[data-testid=input]", "And then?")
        page.click("[data-testid=send]")
        page.wait_for_function("document.querySelectorAll('[data-testid=message][data-role=assistant]"
                               "[data-status=done]').length === 2", timeout=30_000)
        assert [m["role"] for m in bodies[-1]["messages"]] == ["user", "assistant", "user"]
        first_reply = page.locator("[data-testid=message][data-role=assistant] [data-testid=content]").first
        assert bodies[-1]["messages"][1]["content"].strip()[:5] in first_reply.inner_text()

        # Edit the first question: the conversation is cut there and answered again.
        page.locator("[data-testid=edit]").first.click()
        page.fill("[data-testid=edit-input]", "Good morrow")
        page.click("[data-testid=save-edit]")
        page.wait_for_function("document.querySelectorAll('[data-testid=message][data-role=assistant]"
                               "[data-status=done]').length === 1 && !document.querySelector('[data-status=streaming]')",
                               timeout=30_000)
        assert bodies[-1]["messages"] == [{"role": "user", "content": "Good morrow"}]
        assert page.locator("[data-testid=message][data-role=user]").all_inner_texts()[0].endswith("Good morrow")

        # An error from the server is shown to the user, and the page keeps working.
        page.fill("[data-testid=max-tokens]", "100000")
        page.fill("[data-testid=input]", "Too long")
        page.click("[data-testid=send]")
        error = page.wait_for_selector("[data-testid=message][data-role=error]", timeout=30_000)
        assert "maximum context length" in error.inner_text()
        assert page.input_value("[data-testid=input]") == "Too long"  # handed back for another try
        assert page.locator("[data-testid=message][data-role=user]").count() == 1
        page.fill("[data-testid=max-tokens]", "5")
        page.fill("[data-testid=input]", "Once more")
        page.click("[data-testid=send]")
        page.wait_for_function("!document.querySelector('[data-role=error]') && "
                               "!document.querySelector('[data-status=streaming]')", timeout=30_000)
        assert [m["role"] for m in bodies[-1]["messages"]] == ["user", "assistant", "user"]

        # Code blocks render as <pre><code>, model text is never HTML.
        html = page.evaluate("renderText('Run:\\n```python\\nprint(1 < 2)\\n```\\nthen <b>x</b> `y`')")
        assert ('<pre><span class="lang">python</span><code>print(1 &lt; 2)</code><button type="button" '
                'class="copy-code" data-testid="copy-code">Copy</button></pre>') in html
        assert "&lt;b&gt;x&lt;/b&gt;" in html and "<code>y</code>" in html
        assert httpx.get(f"{server.url}/health").status_code == 200
    finally:
        page.close()
        server.stop()


@pytest.mark.slow
def test_model_picker_code_preset_and_chinese_ui(small_tokenizer, browser):
    from api_testing import serve_in_thread

    from portachat.serve.api import ServerSettings, create_app
    from portachat.serve.registry import ModelRegistry, ModelSpec

    tok = chat_tokenizer(small_tokenizer)
    seeds = {"general": 1, "coder": 2}
    registry = ModelRegistry([ModelSpec("general", "", pinned=True), ModelSpec("coder", "")],
                             lambda spec: served_tiny(tok, max_model_len=1024, model=tiny_model(
                                 tok.vocab_size, seed=seeds[spec.name], max_seq_len=1024)))
    server = serve_in_thread(create_app(ServerSettings(served_model_name="general"), registry=registry))
    context = browser.new_context(locale="zh-CN")
    page = context.new_page()
    bodies: list[dict] = []
    page.on("request", lambda r: bodies.append(json.loads(r.post_data)) if r.method == "POST" else None)
    try:
        page.goto(server.url + "/")  # while the first model may still be loading: the page asks again
        page.wait_for_function("document.querySelectorAll('[data-testid=model] option').length === 2")
        # The page speaks the browser's language.
        assert page.inner_text("[data-testid=send]") == "发送" and page.get_attribute("html", "lang") == "zh-CN"
        assert "有问题尽管问" in page.inner_text("[data-testid=messages]")
        options = page.eval_on_selector_all("[data-testid=model] option", "os => os.map(o => [o.value, o.dataset.status])")
        assert options == [["general", "loaded"], ["coder", "available"]]

        # Pick the second model and the code preset: the request names both.
        page.select_option("[data-testid=model]", "coder")
        page.select_option("[data-testid=mode]", "code")
        page.select_option("[data-testid=code-language]", "Rust")
        assert "代码块" in page.inner_text("[data-testid=messages]")
        page.click("[data-testid=toggle-settings]")
        page.fill("[data-testid=max-tokens]", "16")
        page.fill("[data-testid=input]", "写一个函数")
        page.keyboard.press("Enter")
        page.wait_for_selector("[data-testid=message][data-role=assistant][data-status=done]", timeout=60_000)
        body = bodies[-1]
        assert body["model"] == "coder" and body["temperature"] <= 0.2
        assert body["messages"][0]["role"] == "system" and "Rust" in body["messages"][0]["content"]
        assert "```rust" in body["messages"][0]["content"]
        assert body["messages"][-1] == {"role": "user", "content": "写一个函数"}
        assert page.locator("[data-testid=message][data-role=assistant] strong").inner_text() == "coder"
        assert {m["id"]: m["status"] for m in httpx.get(f"{server.url}/v1/models").json()["data"]}["coder"] == "loaded"
        # Code blocks carry a copy button, labelled in the page's language.
        html = page.evaluate("renderText('```rust\\nfn main() {}\\n```')")
        assert 'data-testid="copy-code">复制</button>' in html
    finally:
        page.close()
        context.close()
        server.stop()


@pytest.mark.slow
def test_documents_panel_uploads_a_file_and_answers_show_their_sources(small_tokenizer, browser):
    from api_testing import serve_in_thread

    from portachat.engine.loading import LoadOptions, load_served_model
    from portachat.serve.api import ServerSettings, create_app
    from portachat.serve.registry import ModelRegistry, ModelSpec
    from tests.minilm import minilm_dir

    tok = chat_tokenizer(small_tokenizer)
    minilm = load_served_model(LoadOptions(model=str(minilm_dir()), device="cpu", dtype="fp32"), embedding_models=True)
    made = {"tiny": lambda: served_tiny(tok, max_model_len=2048, model=tiny_model(tok.vocab_size, max_seq_len=2048)),
            "minilm": lambda: minilm}
    registry = ModelRegistry([ModelSpec("tiny", "", pinned=True), ModelSpec("minilm", "", pinned=True)],
                             lambda spec: made[spec.name]())
    server = serve_in_thread(create_app(ServerSettings(served_model_name="tiny"), registry=registry))
    page = browser.new_page()
    bodies: list[dict] = []
    page.on("request", lambda r: bodies.append(json.loads(r.post_data))
            if r.method == "POST" and r.url.endswith("/chat/completions") else None)
    try:
        page.goto(server.url + "/")
        page.wait_for_function("document.querySelectorAll('[data-testid=model] option').length === 2")
        page.select_option("[data-testid=model]", "tiny")
        page.click("[data-testid=toggle-docs]")
        page.fill("[data-testid=collection-name]", "garden")
        page.click("[data-testid=new-collection]")
        page.wait_for_function("document.querySelector('[data-testid=collection]').selectedOptions[0].text.startsWith('garden')")
        text = "Tomatoes need six hours of sun a day. Water them deeply twice a week.\n\n番茄每天需要六小时的阳光。"
        page.set_input_files("[data-testid=doc-file]", files=[
            {"name": "tomatoes.md", "mimeType": "text/markdown", "buffer": text.encode()}])
        page.wait_for_function("document.querySelector('[data-testid=doc-status]').textContent.startsWith('Added tomatoes.md')",
                               timeout=60_000)
        page.wait_for_selector("[data-testid=doc-file-name]:has-text('tomatoes.md')")
        store = httpx.get(f"{server.url}/v1/vector_stores", timeout=30).json()["data"]
        assert [(s["name"], s["file_counts"]["completed"]) for s in store] == [("garden", 1)]

        page.click("[data-testid=toggle-settings]")
        page.fill("[data-testid=max-tokens]", "8")
        page.fill("[data-testid=input]", "How much sun do tomatoes need?")
        page.keyboard.press("Enter")
        page.wait_for_selector("[data-testid=message][data-role=assistant][data-status=done]", timeout=60_000)
        assert bodies[-1]["documents"] == {"vector_store_ids": [store[0]["id"]], "max_num_results": 4}
        sources = page.locator("[data-testid=message][data-role=assistant] [data-testid=source]")
        assert sources.count() == 1 and sources.first.inner_text().startswith("tomatoes.md · part 1")
        assert "six hours of sun" in sources.first.get_attribute("title")

        # "No documents": an ordinary chat, no sources under the answer.
        page.select_option("[data-testid=collection]", "")
        page.fill("[data-testid=input]", "hello")
        page.keyboard.press("Enter")
        page.wait_for_function("document.querySelectorAll('[data-testid=message][data-role=assistant][data-status=done]').length === 2",
                               timeout=60_000)
        assert "documents" not in bodies[-1]
        assert page.locator("[data-testid=message][data-role=assistant]").nth(1).locator("[data-testid=source]").count() == 0
    finally:
        page.close()
        server.stop()
