#!/usr/bin/env python3
r"""Check the rendered book in a real headless browser (Debian's Chromium), page by page.

    python scripts/check_browser.py [_build/html] [--screenshots _build/screenshots] [--pages PATTERN ...]

Every HTML page of the built book (except genindex, search, _static, _sources) is opened in one headless
Chromium session, in one reused tab, driven through the DevTools protocol over a pipe (stdlib only, no
network port). For each page it checks that

* math rendered: every formula in the page source (the `.math` spans/divs Sphinx emits) became a MathJax
  `mjx-container`, no raw TeX is left, and MathJax reported no error (`mjx-merror`) or undefined macro;
* no MyST role ({eq}, {numref}, {ref}, {term}, {doc}, {glue:...}, {cite:...}, any {name}`...`) and no TeX
  control word (\frac, \rVert, any \word) is left as text on the page outside code; inside rendered math, no
  role in a formula's TeX and no control word or escape drawn as text (\text{log\_p} shows its backslash);
* no Markdown table is left as text outside code: no line of a paragraph (or any block of page text) is a
  table row (`| preset | options |`) or holds a separator cell (`|---|`), as a generated table that was not
  parsed shows (inside a real table's cell only a separator cell counts);
* every image loaded (naturalWidth > 0) and has a caption or alt text that is not a file hash;
* every internal link resolves: no link to a missing local file, no dangling `#id`;
* no JavaScript error reached the console, and no request left the machine (only file:, data:, blob: and
  about: URLs; http(s) and ws(s) requests are blocked, logged and reported);
* at a 1280-px-wide laptop viewport nothing scrolls sideways or is cut off: no code or output box, display
  equation, inline formula or table is wider than its box, code is drawn at 13 px or more and the widest
  code box holds 100 characters a line (the book's line-length rule for visible code); closed dropdowns are
  opened first, since a reader opens them;
* at both widths no comma, full stop or bracket that follows an inline formula starts a line of its own;
* at a 390-px-wide phone viewport nothing is wider than the page: wide content (display equations, tables,
  code) may scroll inside its own box but neither widens the page nor is clipped, and equation numbers do
  not cover their formula;
* CJK text is drawn with a font that has CJK glyphs (when fontconfig lists one), not with tofu boxes;

and it saves the first screen of the page at desktop (1280 px) and phone (390 px) width as PNG files.
It prints the faults page by page and the total time, writes report.json beside the screenshots, and exits
with status 1 if any page has a fault.
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import fnmatch
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

# Flags from the toolchain notes: headless, no sandbox (root), and none of Chromium's own background traffic.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--mute-audio",
    "--force-device-scale-factor=1",
    "--allow-file-access-from-files",
]
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
INSTALL_HINT = (
    "Chromium was not found. Install it with\n"
    "    sudo apt-get update && sudo apt-get install -y chromium chromium-driver fonts-noto-cjk   # Debian/Ubuntu\n"
    "or point CHROMIUM=/path/to/chromium at any Chromium or Chrome build."
)
SKIP_PAGES = {"genindex.html", "search.html"}
SKIP_DIRS = {"_static", "_sources", "_images", ".doctrees"}
LOCAL_SCHEMES = {"file", "data", "blob", "about"}
DESKTOP = {"width": 1280, "height": 800, "deviceScaleFactor": 1, "mobile": False}
PHONE = {"width": 390, "height": 844, "deviceScaleFactor": 1, "mobile": True}
CJK_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")
HASH_RE = re.compile(r"[0-9a-f]{16,}", re.I)
IMAGE_EXT_RE = re.compile(r"\.(png|jpe?g|gif|svg|webp)$", re.I)


def find_chromium() -> str | None:
    env = os.environ.get("CHROMIUM")
    if env:
        return env if shutil.which(env) or Path(env).is_file() else None
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def cjk_font_families() -> set[str]:
    """Families that fontconfig says cover Chinese (empty when none is installed or fc-list is missing)."""
    if not shutil.which("fc-list"):
        return set()
    out = subprocess.run(["fc-list", ":lang=zh", "family"], capture_output=True, text=True).stdout
    return {name.strip() for line in out.splitlines() for name in line.split(",") if name.strip()}


# --------------------------------------------------------------------------------------------------------
# The DevTools protocol over --remote-debugging-pipe: Chromium reads JSON messages ending in NUL on fd 3 and
# writes them on fd 4.
class CDPError(RuntimeError):
    pass


class Browser:
    def __init__(self, chromium: str, log_path: Path | None = None):
        self.profile = tempfile.mkdtemp(prefix="rlbook-chromium-")
        to_chrome_r, self._w = os.pipe()
        self._r, from_chrome_w = os.pipe()
        # Chromium's ends go to fds >= 10 first, so that mapping them onto 3 and 4 in the child cannot clobber
        # one with the other. (Python opens descriptors non-inheritable, so nothing else reaches Chromium.)
        hi_r = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD_CLOEXEC, 10)
        hi_w = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_chrome_r)
        os.close(from_chrome_w)

        def map_pipe_fds():  # runs in the child between fork and exec (no threads here)
            os.dup2(hi_r, 3)  # dup2's copies are inherited across exec
            os.dup2(hi_w, 4)

        self._log = open(log_path, "wb") if log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            [chromium, *CHROMIUM_FLAGS, "--remote-debugging-pipe", f"--user-data-dir={self.profile}",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
            preexec_fn=map_pipe_fds, close_fds=False,  # close_fds would run after preexec_fn and close 3 and 4
        )
        os.close(hi_r)
        os.close(hi_w)
        self._buf = b""
        self._next_id = 0
        self._events: list[dict] = []
        self.listeners = []  # callables(event) called for every event as it arrives

    # -- transport
    def _read_messages(self, timeout: float) -> list[dict]:
        ready, _, _ = select.select([self._r], [], [], max(timeout, 0))
        if not ready:
            return []
        chunk = os.read(self._r, 1 << 20)
        if not chunk:
            raise CDPError(f"Chromium closed the DevTools pipe (exit code {self.proc.poll()})")
        self._buf += chunk
        *messages, self._buf = self._buf.split(b"\0")
        return [json.loads(m) for m in messages if m]

    def _dispatch(self, msg: dict) -> dict | None:
        if "id" in msg:
            return msg
        for listener in self.listeners:
            listener(msg)
        self._events.append(msg)
        return None

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 30.0) -> dict:
        self._next_id += 1
        ident = self._next_id
        msg = {"id": ident, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        data = json.dumps(msg).encode() + b"\0"
        while data:
            data = data[os.write(self._w, data):]
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CDPError(f"{method}: no answer from Chromium in {timeout:.0f} s")
            for m in self._read_messages(left):
                reply = self._dispatch(m)
                if reply is not None and reply["id"] == ident:
                    if "error" in reply:
                        raise CDPError(f"{method}: {reply['error'].get('message')}")
                    return reply.get("result", {})

    def wait_event(self, method: str, session: str | None, timeout: float) -> dict | None:
        deadline = time.monotonic() + timeout
        while True:
            for i, ev in enumerate(self._events):
                if ev.get("method") == method and ev.get("sessionId") == session:
                    del self._events[: i + 1]
                    return ev
            self._events.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            for m in self._read_messages(min(left, 0.5)):
                self._dispatch(m)

    def close(self):
        try:
            self.send("Browser.close", timeout=5)
        except (CDPError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
        if self._log is not subprocess.DEVNULL:
            self._log.close()
        shutil.rmtree(self.profile, ignore_errors=True)


# --------------------------------------------------------------------------------------------------------
# What the page source says (parsed in Python, independent of what the browser made of it).
class _SourceParser(HTMLParser):
    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
            "track", "wbr"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.formulas = 0
        self.refresh: str | None = None
        self._stack: list[bool] = []  # per open element: inside a .math element?
        self._text: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ("id", "name"):
            if a.get(key):
                self.ids.add(a[key])
        if tag == "meta" and (a.get("http-equiv") or "").lower() == "refresh":
            m = re.search(r"url=(.*)", a.get("content") or "", re.I)
            self.refresh = m.group(1).strip(" '\"") if m else ""
        if tag in self.VOID:
            return
        inside = bool(self._stack and self._stack[-1]) or "math" in (a.get("class") or "").split()
        self._stack.append(inside)

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if self._stack:
            was_inside = self._stack.pop()
            if was_inside and not (self._stack and self._stack[-1]):
                self._count()

    def handle_data(self, data):
        if self._stack and self._stack[-1]:
            self._text.append(data)

    def _count(self):
        text = "".join(self._text)
        self._text = []
        # a TeX line break `\\[2pt]` is not an opening `\[`: drop escaped backslashes before counting
        text = text.replace("\\\\", "")
        self.formulas += len(re.findall(r"\\\(|\\\[", text)) + text.count("$$") // 2


_source_cache: dict[Path, _SourceParser] = {}


def parse_source(path: Path) -> _SourceParser:
    path = path.resolve()
    if path not in _source_cache:
        p = _SourceParser()
        p.feed(path.read_text(encoding="utf-8", errors="replace"))
        p.close()
        _source_cache[path] = p
    return _source_cache[path]


# --------------------------------------------------------------------------------------------------------
# What runs in the page.
JS_DESKTOP = r"""
(async () => {
  const out = {};
  const sleep = ms => new Promise(r => setTimeout(r, ms));
  // MathJax 3 is loaded with `defer` on pages that have math; wait for it to start and finish typesetting.
  const hasMathScript = !!document.querySelector('script[src*="mathjax" i], script[src*="MathJax"]');
  for (let i = 0; hasMathScript && i < 200 && !(window.MathJax && MathJax.startup && MathJax.startup.promise); i++)
    await sleep(25);
  const mj = window.MathJax;
  out.mathjax = !!(mj && mj.version);
  if (mj && mj.startup && mj.startup.promise) {
    try { await mj.startup.promise; } catch (e) { out.mathjaxFailure = String(e); }
  }
  await document.fonts.ready;
  // Images: wait for the ones still loading (lazy ones are made eager).
  const imgs = Array.from(document.images);
  await Promise.all(imgs.map(img => {
    if (img.complete) return null;
    img.loading = 'eager';
    return Promise.race([new Promise(r => { img.addEventListener('load', r); img.addEventListener('error', r); }),
                         sleep(5000)]);
  }));
  const maths = Array.from(document.querySelectorAll('.math'));
  const outer = maths.filter(el => !el.parentElement.closest('.math'));
  out.mathElements = outer.length;
  out.rendered = document.querySelectorAll('.math mjx-container').length;
  out.rawTex = [];
  for (const el of outer) {
    const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    for (let n = walker.nextNode(); n; n = walker.nextNode()) {
      if (n.parentElement.closest('mjx-container, .eqno')) continue;
      if (/\\[\(\[]|\\begin\{|\$\$/.test(n.data)) { out.rawTex.push(n.data.trim().slice(0, 120)); break; }
    }
  }
  // MyST roles and TeX control words left as text. Page text: every text node outside code, scripts and
  // rendered formulas. Rendered math: the TeX source of each formula (a role inside math is still text to
  // MathJax) and each token MathJax drew (an \text{\frac} or \_ inside \text shows its backslash).
  const ROLE = /\{(?:eq|numref|ref|term|doc|download|glue(?::\w+)?|cite(?::\w+)?|prf:ref)\}(?:`[^`]*`)?|\{[A-Za-z][\w:+-]*\}`[^`]*`?/g;
  const TEX_WORD = /\\[A-Za-z]+/g, TEX_IN_MATH = /\\[A-Za-z]+|\\[_{}$%&#^]/;
  const snippet = (text, m) => text.slice(Math.max(0, m.index - 20), m.index + m[0].length + 20).replace(/\s+/g, ' ').trim();
  const NOT_TEXT = 'script, style, noscript, template, textarea, code, pre, kbd, samp, tt, .highlight, mjx-container';
  out.rawRoles = []; out.texWords = [];
  const textWalker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = textWalker.nextNode(); n; n = textWalker.nextNode()) {
    if (!n.parentElement || n.parentElement.closest(NOT_TEXT)) continue;
    for (const m of n.data.matchAll(ROLE)) if (out.rawRoles.length < 10) out.rawRoles.push(snippet(n.data, m));
    const words = Array.from(n.data.matchAll(TEX_WORD));
    if (words.length && out.texWords.length < 10)
      out.texWords.push({words: Array.from(new Set(words.map(m => m[0]))).slice(0, 6),
                         context: n.data.slice(Math.max(0, words[0].index - 20), words[0].index + 80).replace(/\s+/g, ' ').trim()});
  }
  // A Markdown table that was not parsed shows as paragraphs of text: lines such as "| preset | options |" and
  // "|---|---|". Each block of page text (a paragraph, a list item, a cell: the nearest ancestor that is not
  // laid out inline) is read line by line, its inline code and formulas standing in as one character each (a
  // row may hold them) and code blocks, <br> and nested blocks breaking the line; the first line that is a
  // row (starts and ends with "|", so at least two) or holds a separator cell ("|---|", "| :--: |") is reported.
  const MD_ROW = /^\s*\|.*\|\s*$/, MD_SEP = /\|\s*:?-{3,}:?\s*\|/;
  const SKIPPED = 'script, style, noscript, template, textarea';
  const CODE_BLOCK = 'pre, .highlight, div.math, mjx-container[display="true"]';
  const INLINE_ATOM = 'code, kbd, samp, tt, mjx-container, .math';
  const isInline = el => /^inline|^contents$/.test(getComputedStyle(el).display);
  const blockText = block => {
    let s = '';
    for (const c of block.childNodes) {
      if (c.nodeType === 3) { s += c.data; continue; }
      if (c.nodeType !== 1 || c.matches(SKIPPED)) continue;
      if (c.matches(CODE_BLOCK) || c.tagName === 'BR' || !isInline(c)) s += '\n';
      else if (c.matches(INLINE_ATOM)) s += '\u00b7';
      else s += blockText(c);
    }
    return s;
  };
  out.markdownTables = [];
  const seenBlocks = new Set();
  const pipeWalker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = pipeWalker.nextNode(); n && out.markdownTables.length < 5; n = pipeWalker.nextNode()) {
    if (!n.data.includes('|') || !n.parentElement || n.parentElement.closest(NOT_TEXT + ', .math'))
      continue;
    let block = n.parentElement;
    while (block.parentElement && block !== document.body && isInline(block)) block = block.parentElement;
    if (seenBlocks.has(block)) continue;
    seenBlocks.add(block);
    // in a real table's cell, "|x|" is the cell's content: only a separator cell counts there
    const inCell = !!block.closest('td, th');
    const line = blockText(block).split('\n').find(l => MD_SEP.test(l) || (!inCell && MD_ROW.test(l)));
    if (line !== undefined) out.markdownTables.push(line.replace(/\s+/g, ' ').trim().slice(0, 120));
  }
  out.mathRoles = []; out.mathTexWords = [];
  if (mj && mj.startup && mj.startup.document) {
    for (const item of mj.startup.document.math) {
      const tex = String(item.math || '');
      if (/\{[A-Za-z][\w:+-]*\}\s*`/.test(tex) && out.mathRoles.length < 10)
        out.mathRoles.push(tex.replace(/\s+/g, ' ').trim().slice(0, 120));
    }
  }
  for (const c of document.querySelectorAll('mjx-container')) {
    const mml = c.querySelector('mjx-assistive-mml');
    if (!mml) continue;
    for (const t of mml.querySelectorAll('mi, mo, mn, mtext, ms')) {
      const m = TEX_IN_MATH.exec(t.textContent);
      if (m && out.mathTexWords.length < 10) {
        out.mathTexWords.push({shown: m[0], tex: (texOf(c) || '').replace(/\s+/g, ' ').trim().slice(0, 120)});
        break;
      }
    }
  }
  out.mathErrors = [];
  const seen = new Set();
  function texOf(node) {
    if (mj && mj.startup && mj.startup.document)
      for (const item of mj.startup.document.math)
        if (item.typesetRoot && item.typesetRoot.contains(node)) return item.math;
    return null;
  }
  for (const e of document.querySelectorAll('mjx-merror')) {
    const c = e.closest('mjx-container'); if (seen.has(c)) continue; seen.add(c);
    out.mathErrors.push({kind: 'error', message: e.getAttribute('data-mjx-error') || e.textContent.trim(),
                         tex: (texOf(e) || '').slice(0, 160)});
  }
  // MathJax's noundefined package draws an unknown macro as red text instead of raising.
  for (const e of document.querySelectorAll('mjx-container [style*="color: red"], mjx-container [mathcolor="red"]')) {
    const c = e.closest('mjx-container'); if (seen.has(c)) continue; seen.add(c);
    out.mathErrors.push({kind: 'undefined', message: 'drawn in red (an undefined macro?): ' + e.textContent.trim(),
                         tex: (texOf(e) || '').slice(0, 160)});
  }
  const captionOf = img => {
    const fig = img.closest('figure, div.figure');
    if (!fig) return '';
    const cap = fig.querySelector('figcaption, .caption');
    return cap ? cap.textContent.replace(/\s+/g, ' ').trim() : '';
  };
  const article = document.querySelector('article') || document.querySelector('main') || document.body;
  out.images = imgs.map(img => ({
    src: img.getAttribute('src') || '', url: img.currentSrc || img.src,
    loaded: img.complete && img.naturalWidth > 0, alt: img.getAttribute('alt'),
    caption: captionOf(img), inArticle: article.contains(img),
  }));
  out.links = Array.from(document.querySelectorAll('a[href]')).map(a => ({
    raw: a.getAttribute('href'), url: a.href, text: a.textContent.replace(/\s+/g, ' ').trim().slice(0, 60)}));
  out.ids = Array.from(document.querySelectorAll('[id]')).map(e => e.id)
    .concat(Array.from(document.querySelectorAll('a[name]')).map(e => e.getAttribute('name')));
  // sphinx-togglebutton turns `.toggle` / `.admonition.dropdown` into dropdowns through their title; one
  // without a title (a bare prf:proof with :class: dropdown) throws and breaks every dropdown after it.
  out.untitledDropdowns = Array.from(document.querySelectorAll('.admonition.dropdown, .admonition.toggle'))
    .filter(e => !e.querySelector('.admonition-title'))
    .map(e => (e.id ? '#' + e.id + ' ' : '') + e.className + ': ' + e.textContent.replace(/\s+/g, ' ').trim().slice(0, 60));
  out.title = document.title;
  return out;
})()
"""

# The layout of the page at the current viewport width. At 1280 px (strict) a box that scrolls sideways is a
# fault too, and code boxes must hold 100 characters; at 390 px wide content may scroll inside its own box.
JS_LAYOUT = r"""
(async (strict) => {
  // A reader opens dropdowns (proofs, solutions, hidden code): their content must fit too.
  for (const d of document.querySelectorAll('details')) d.open = true;
  for (const e of document.querySelectorAll('.toggle-hidden')) e.classList.remove('toggle-hidden');
  window.scrollTo(0, 0);
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  // let sidebars and dropdowns finish sliding before measuring
  await Promise.race([Promise.all(document.getAnimations().map(a => a.finished.catch(() => null))),
                      new Promise(r => setTimeout(r, 2000))]);
  await document.fonts.ready;
  const vw = document.documentElement.clientWidth;
  const out = {vw, scrollWidth: document.documentElement.scrollWidth, faults: []};
  const describe = el => {
    let s = el.tagName.toLowerCase();
    if (el.id) s += '#' + el.id;
    const cls = (typeof el.className === 'string' ? el.className : '').trim().split(/\s+/).filter(Boolean).slice(0, 3);
    if (cls.length) s += '.' + cls.join('.');
    const text = (el.textContent || '').replace(/\s+/g, ' ').trim().slice(0, 70);
    return text ? `${s} ("${text}")` : s;
  };
  const tag = el => describe(el).split(' (')[0];
  const flagged = new Set();
  const underFlagged = el => { for (let a = el.parentElement; a; a = a.parentElement) if (flagged.has(a)) return true; return false; };
  // MathJax's screen-reader copy (mjx-assistive-mml) is clipped to nothing on purpose: never count it.
  const SKIP = 'dialog:not([open]), [hidden], .visually-hidden, .sr-only, mjx-assistive-mml';
  // How far the drawn content of el reaches past its right edge (descendants' boxes, not scrollWidth,
  // which counts the invisible assistive MathML too).
  const overhang = el => {
    const right = el.getBoundingClientRect().right;
    let most = 0;
    for (const d of el.querySelectorAll('*')) {
      if (d.closest('mjx-assistive-mml')) continue;
      const r = d.getBoundingClientRect();
      if (r.width < 1 || r.height < 1) continue;
      const cs = getComputedStyle(d);
      if (cs.visibility === 'hidden' || cs.position === 'fixed') continue;
      most = Math.max(most, r.right - right);
    }
    return most;
  };
  const inView = r => r.left >= -1 && r.right <= vw + 1;
  // Walk the page, skipping hidden subtrees and the inside of formulas (a formula is judged by its box).
  const elements = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_ELEMENT, {acceptNode: el => {
    if (el.matches(SKIP)) return NodeFilter.FILTER_REJECT;
    const cs = getComputedStyle(el);
    if (cs.display === 'none' || cs.position === 'fixed') return NodeFilter.FILTER_REJECT;
    if (el.parentElement && el.parentElement.tagName === 'MJX-CONTAINER') return NodeFilter.FILTER_REJECT;
    return NodeFilter.FILTER_ACCEPT;
  }});
  for (let el = walker.nextNode(); el; el = walker.nextNode()) elements.push(el);
  for (const el of elements) {
    const cs = getComputedStyle(el);
    if (cs.visibility === 'hidden') continue;
    const r = el.getBoundingClientRect();
    if (r.width < 1 || r.height < 1) continue;
    if (r.right <= 0) continue;  // entirely left of the page: an off-canvas drawer, not reachable by scrolling
    if (!inView(r)) {
      if (underFlagged(el)) continue;
      let how = 'widens the page';
      for (let a = el.parentElement; a && a !== document.documentElement; a = a.parentElement) {
        const acs = getComputedStyle(a);
        if (acs.position === 'fixed') { how = null; break; }
        const o = acs.overflowX;
        if (o === 'auto' || o === 'scroll') { how = null; break; }  // scrolls inside its own box
        if (o === 'hidden' || o === 'clip') {
          // clipped by a box that is itself on the page: the content is cut off
          how = inView(a.getBoundingClientRect()) ? 'is cut off by ' + tag(a) : null;
          break;
        }
      }
      if (how) {
        flagged.add(el);
        out.faults.push(`${describe(el)} is ${Math.round(r.width)} px wide at x=${Math.round(r.left)}..${Math.round(r.right)} and ${how}`);
      }
      continue;
    }
    // Content that overflows a box which hides its overflow is cut off, even inside the page.
    if ((cs.overflowX === 'hidden' || cs.overflowX === 'clip') && el.scrollWidth > el.clientWidth + 2
        && !el.closest('mjx-container') && cs.textOverflow !== 'ellipsis' && !underFlagged(el)) {
      const o = overhang(el);
      if (o > 2) {
        flagged.add(el);
        out.faults.push(`${describe(el)} cuts off ${Math.round(o)} px of its content (it hides its overflow)`);
      }
    }
  }
  // Punctuation that follows an inline formula must not start a line of its own (_ext/rlbook_html.py keeps
  // them together); judged where the text was laid out, so only on lines that actually broke there.
  let strays = 0;
  for (const math of document.querySelectorAll('span.math')) {
    const next = math.nextSibling;
    if (!next || next.nodeType !== 3 || !/^[,.;:!?)\]]/.test(next.data) || !math.getClientRects().length) continue;
    const range = document.createRange();
    range.setStart(next, 0); range.setEnd(next, 1);
    const p = range.getBoundingClientRect(), m = math.getBoundingClientRect();
    if (p.height > 0 && p.top >= m.bottom - 2 && strays++ < 5)
      out.faults.push(`"${next.data[0]}" after the formula "${math.textContent.replace(/\s+/g, ' ').trim().slice(0, 40)}" starts a new line`);
  }
  // Equation numbers must not cover the visible part of their formula.
  const visibleRect = el => {
    let r = el.getBoundingClientRect();
    let left = r.left, right = r.right, top = r.top, bottom = r.bottom;
    for (let a = el.parentElement; a && a !== document.body; a = a.parentElement) {
      if (getComputedStyle(a).overflowX === 'visible') continue;
      const b = a.getBoundingClientRect();
      left = Math.max(left, b.left); right = Math.min(right, b.right);
      top = Math.max(top, b.top); bottom = Math.min(bottom, b.bottom);
    }
    return {left, right, top, bottom};
  };
  for (const div of document.querySelectorAll('div.math')) {
    const no = div.querySelector('.eqno'), m = div.querySelector('mjx-container mjx-math');
    if (!no || !m) continue;
    const a = no.getBoundingClientRect(), b = visibleRect(m);
    const dx = Math.min(a.right, b.right) - Math.max(a.left, b.left);
    const dy = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
    if (dx > 1 && dy > 1)
      out.faults.push(`equation number ${no.textContent.replace('#', '').trim()} covers ${Math.round(dx)} px of its formula`);
  }
  if (out.scrollWidth > vw + 1)
    out.faults.unshift(`the page is ${out.scrollWidth} px wide in a ${vw} px viewport (it scrolls sideways)`);
  if (strict) {
    const root = document.querySelector('article') || document.querySelector('main') || document.body;
    const visible = el => el.getClientRects().length > 0 && getComputedStyle(el).visibility !== 'hidden';
    // The width of one character in a code box, and how many fit on a line of its content box.
    const capacity = pre => {
      const cs = getComputedStyle(pre), probe = document.createElement('span');
      probe.textContent = '0'.repeat(100);
      pre.appendChild(probe);
      const ch = probe.getBoundingClientRect().width / 100;
      probe.remove();
      const inner = pre.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
      return {font: parseFloat(cs.fontSize), ch, chars: ch > 0 ? Math.floor(inner / ch + 0.01) : 0, width: pre.clientWidth};
    };
    // Boxes in the article that scroll sideways (the innermost one when they nest). Display formulas are
    // judged by their formula's width (reported with the math), not here.
    const boxes = [];
    for (const el of root.querySelectorAll('*')) {
      if (el.closest('mjx-container, ' + SKIP) || !visible(el)) continue;
      const o = getComputedStyle(el).overflowX;
      if ((o === 'auto' || o === 'scroll') && el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 1) boxes.push(el);
    }
    for (const el of boxes) {
      if (boxes.some(other => other !== el && el.contains(other))) continue;
      const pre = el.matches('pre') ? el : el.querySelector('pre');
      const table = el.matches('table') ? el : el.querySelector('table');
      const where = el.scrollWidth + ' px of content in a ' + el.clientWidth + ' px box';
      if (pre) {
        const lines = pre.textContent.split('\n');
        const longest = lines.reduce((a, b) => (b.length > a.length ? b : a), '');
        const c = capacity(pre);
        out.faults.push(`code box scrolls sideways (${where}): its longest line has ${longest.length} characters, `
                        + `${c.chars} fit: "${longest.trim().slice(0, 60)}"`);
      } else if (table) {
        out.faults.push(`table scrolls sideways (${where}): ${describe(table)}`);
      } else if (el.matches('span.math')) {
        out.faults.push(`inline formula scrolls sideways (${where}): ${describe(el)}`);
      } else {
        out.faults.push(`${describe(el)} scrolls sideways (${where})`);
      }
    }
    // Display formulas wider than their box (they scroll, or are cut off), dropdowns included.
    const mj = window.MathJax;
    const texOf = node => {
      if (mj && mj.startup && mj.startup.document)
        for (const item of mj.startup.document.math)
          if (item.typesetRoot && item.typesetRoot.contains(node)) return item.math;
      return '';
    };
    for (const c of document.querySelectorAll('mjx-container[display="true"]')) {
      const m = c.querySelector('mjx-math');
      if (!m || !visible(c) || m.getBoundingClientRect().width <= c.clientWidth + 2) continue;
      const eqno = c.closest('.math') && c.closest('.math').querySelector('.eqno');
      out.faults.push(`display equation wider than the column (it scrolls): ${Math.round(m.getBoundingClientRect().width)} px `
                      + `formula in a ${c.clientWidth} px box: ` + (eqno ? eqno.textContent.replace('#', '').trim() + ' ' : '')
                      + texOf(m).replace(/\s+/g, ' ').trim().slice(0, 60));
    }
    // Code boxes in the article's column: a legible font, and room for a 100-character line.
    const pres = Array.from(root.querySelectorAll('div.highlight pre')).filter(visible);
    if (pres.length) {
      const caps = pres.map(capacity);
      const best = caps.reduce((a, b) => (b.chars > a.chars ? b : a));
      out.codeColumn = best;
      const small = Math.min(...caps.map(c => c.font));
      if (small < 13) out.faults.push(`code is drawn at ${small} px: at least 13 px is legible beside 16-px text`);
      if (best.chars < 100)
        out.faults.push(`the widest code box (${best.width} px, ${best.font}-px font) holds ${best.chars} characters a line: 100 must fit`);
    }
  }
  // Mark elements whose own text has CJK characters, for the font check done through the protocol.
  let n = 0;
  for (const el of document.body.querySelectorAll('*')) {
    if (n >= 40) break;
    if (Array.from(el.childNodes).some(c => c.nodeType === 3 && /[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]/.test(c.data))) {
      el.setAttribute('data-browser-check-cjk', String(n++));
    }
  }
  out.cjkElements = n;
  return out;
})(__STRICT__)
"""


# --------------------------------------------------------------------------------------------------------
@dataclass
class PageResult:
    page: str
    faults: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0


def list_pages(html_dir: Path, patterns: list[str] | None = None) -> list[Path]:
    pages = []
    for path in sorted(html_dir.rglob("*.html")):
        rel = path.relative_to(html_dir)
        if rel.parts[0] in SKIP_DIRS or rel.as_posix() in SKIP_PAGES:
            continue
        if patterns and not any(fnmatch.fnmatch(rel.as_posix(), p) for p in patterns):
            continue
        pages.append(path)
    return pages


def is_hash_like(alt: str | None, src: str) -> bool:
    if not alt or not alt.strip():
        return True
    alt = alt.strip()
    base = src.rsplit("/", 1)[-1]
    return alt == src or alt.rsplit("/", 1)[-1] == base or bool(HASH_RE.search(alt)) or bool(IMAGE_EXT_RE.search(alt))


def check_links(page: Path, html_dir: Path, links: list[dict], ids: set[str], result: PageResult):
    here = page.resolve()
    bad = []
    for link in links:
        raw = (link["raw"] or "").strip()
        if not raw or raw == "#" or raw.startswith(("javascript:", "mailto:", "tel:")):
            continue
        parts = urlsplit(link["url"])
        if parts.scheme not in ("file", ""):
            continue  # a link to the web is only a link; following it is the reader's choice (requests are checked)
        target = Path(unquote(parts.path))
        if target.is_dir():
            target = target / "index.html"
        frag = unquote(parts.fragment)
        if target.resolve() == here:
            if frag and frag not in ids:
                bad.append(f"link to #{frag} ({link['text']!r}): no element has that id on this page")
            continue
        if not target.exists():
            try:
                shown = target.resolve().relative_to(html_dir.resolve())
            except ValueError:
                shown = target
            bad.append(f"link {raw!r} ({link['text']!r}): missing local file {shown}")
            continue
        if frag and target.suffix == ".html" and frag not in parse_source(target).ids:
            bad.append(f"link {raw!r} ({link['text']!r}): {target.name} has no element with id {frag!r}")
    # the same broken link repeated (e.g. in a sidebar) is reported once
    result.faults.extend(dict.fromkeys(bad))


class Checker:
    def __init__(self, html_dir: Path, screenshots: Path | None, chromium: str, verbose: bool = False):
        self.html_dir = html_dir.resolve()
        self.screenshots = screenshots
        self.verbose = verbose
        self.cjk_families = cjk_font_families()
        log = (screenshots / "chromium.log") if screenshots else None
        if screenshots:
            screenshots.mkdir(parents=True, exist_ok=True)
        self.browser = Browser(chromium, log)
        b = self.browser
        target = b.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = b.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Network", "Log", "DOM", "CSS"):
            b.send(f"{domain}.enable", session=self.session)
        b.send("Network.setBlockedURLs", {"urls": ["http://*", "https://*", "ws://*", "wss://*", "ftp://*"]},
               session=self.session)
        # Every page is opened as a first visit: the theme would otherwise restore the sidebar's scroll
        # position from the previous page (sessionStorage), and the screenshots would show a scrolled sidebar.
        b.send("Page.addScriptToEvaluateOnNewDocument",
               {"source": "try { sessionStorage.removeItem('sidebar-scroll-top'); } catch (e) {}"}, session=self.session)
        self.console: list[str] = []
        self.requests: list[str] = []
        b.listeners.append(self._on_event)

    def _on_event(self, ev: dict):
        if ev.get("sessionId") != self.session:
            return
        method, p = ev.get("method"), ev.get("params", {})
        if method == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            text = d.get("exception", {}).get("description") or d.get("text", "")
            where = d.get("url", "").rsplit("/", 1)[-1]
            self.console.append(f"uncaught exception{' in ' + where if where else ''}: {text.splitlines()[0]}")
        elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
            self.console.append(f"console.{p['type']}: {args[:200]}")
        elif method == "Log.entryAdded" and p["entry"].get("level") == "error":
            e = p["entry"]
            self.console.append(f"{e.get('source', 'browser')} error: {e.get('text', '')[:200]}"
                                + (f" ({e['url']})" if e.get("url") and e["url"] not in e.get("text", "") else ""))
        elif method == "Network.requestWillBeSent":
            url = p["request"]["url"]
            if urlsplit(url).scheme not in LOCAL_SCHEMES:
                self.requests.append(url)
        elif method == "Network.webSocketCreated":
            self.requests.append(p.get("url", "websocket"))

    def evaluate(self, expression: str, timeout: float = 60.0):
        r = self.browser.send("Runtime.evaluate", {"expression": expression, "awaitPromise": True,
                                                   "returnByValue": True}, session=self.session,
                              timeout=timeout)
        if "exceptionDetails" in r:
            d = r["exceptionDetails"]
            raise CDPError("checker script failed: " + (d.get("exception", {}).get("description") or d.get("text")))
        return r["result"].get("value")

    def screenshot(self, name: str):
        if not self.screenshots:
            return
        data = self.browser.send("Page.captureScreenshot", {"format": "png"}, session=self.session)["data"]
        (self.screenshots / name).write_bytes(base64.b64decode(data))

    def check_page(self, page: Path) -> PageResult:
        rel = page.relative_to(self.html_dir).as_posix()
        result = PageResult(rel)
        t0 = time.monotonic()
        src = parse_source(page)
        if src.refresh is not None:  # a redirect page: only its target has to exist
            target = (page.parent / unquote(urlsplit(src.refresh).path)).resolve()
            if not target.exists():
                result.faults.append(f"redirects to a missing page {src.refresh!r}")
            result.notes.append(f"redirect to {src.refresh}")
            return result
        b, s = self.browser, self.session
        b.send("Emulation.setDeviceMetricsOverride", DESKTOP, session=s)
        self.console.clear()
        self.requests.clear()
        nav = b.send("Page.navigate", {"url": page.resolve().as_uri()}, session=s)
        if nav.get("errorText"):
            result.faults.append(f"the page did not load: {nav['errorText']}")
            return result
        if b.wait_event("Page.loadEventFired", s, timeout=30) is None:
            result.faults.append("the page did not finish loading in 30 s")
        d = self.evaluate(JS_DESKTOP)

        # math
        if src.formulas:
            if not d["mathjax"]:
                result.faults.append(f"{src.formulas} formulas in the source but MathJax did not load")
            elif d["rendered"] < src.formulas:
                result.faults.append(f"MathJax rendered {d['rendered']} of the {src.formulas} formulas in the source")
        if d.get("mathjaxFailure"):
            result.faults.append(f"MathJax failed: {d['mathjaxFailure']}")
        for raw in d["rawTex"][:5]:
            result.faults.append(f"raw TeX left on the page: {raw!r}")
        for raw in d["rawRoles"]:
            result.faults.append(f"MyST role left as text on the page: {raw!r}")
        for line in d["markdownTables"]:
            result.faults.append(f"Markdown table left as text on the page (not parsed): {line!r}")
        for t in d["texWords"]:
            result.faults.append(f"TeX left as text on the page ({' '.join(t['words'])}): {t['context']!r}")
        for tex in d["mathRoles"]:
            result.faults.append(f"MyST role inside a formula (MathJax draws it as text): {tex!r}")
        for m in d["mathTexWords"]:
            result.faults.append(f"TeX drawn as text inside a formula: {m['shown']!r} in {m['tex']!r}")
        for err in d["mathErrors"]:
            result.faults.append(f"MathJax {'error' if err['kind'] == 'error' else 'warning'}: {err['message']}"
                                 + (f" in {err['tex']!r}" if err["tex"] else ""))
        for what in d["untitledDropdowns"]:
            result.faults.append(f"dropdown without a title (breaks sphinx-togglebutton on this page): {what}")
        # images
        for img in d["images"]:
            name = img["src"].rsplit("/", 1)[-1][:40]
            if not img["loaded"]:
                result.faults.append(f"image {img['src']!r} did not load")
            if img["inArticle"] and is_hash_like(img["alt"], img["src"]):
                if img["caption"]:
                    result.warnings.append(f"image {name} has a caption but its alt text is "
                                           f"{'missing' if not img['alt'] else 'a file name'}")
                else:
                    alt = img["alt"] or ""
                    result.faults.append(f"image {name} has no caption and "
                                         + ("no alt text" if not alt.strip() else f"its alt text is a file hash ({alt[:30]}...)"))
        # links
        check_links(page, self.html_dir, d["links"], set(d["ids"]), result)
        self.screenshot(rel.removesuffix(".html").replace("/", "__") + "-desktop.png")

        # desktop layout, with every dropdown open: nothing scrolls sideways, code boxes hold 100 characters
        w = self.evaluate(JS_LAYOUT.replace("__STRICT__", "true"))
        result.faults.extend(f"at {w['vw']} px: {f}" for f in w["faults"])
        if w.get("codeColumn"):
            c = w["codeColumn"]
            result.notes.append(f"code column at {w['vw']} px: {c['width']} px, {c['font']:g}-px font, "
                                f"{c['ch']:.2f} px a character, {c['chars']} characters a line")

        # phone width
        b.send("Emulation.setDeviceMetricsOverride", PHONE, session=s)
        p = self.evaluate(JS_LAYOUT.replace("__STRICT__", "false"))
        result.faults.extend(f"at {p['vw']} px: {f}" for f in p["faults"])
        if p["cjkElements"]:
            self.check_cjk(result)
        self.screenshot(rel.removesuffix(".html").replace("/", "__") + "-phone.png")

        # console and network (everything seen while the page loaded and was checked)
        for msg in dict.fromkeys(self.console):
            result.faults.append(f"console: {msg}")
        for url in dict.fromkeys(self.requests):
            result.faults.append(f"request leaves the machine (blocked): {url}")
        result.seconds = time.monotonic() - t0
        return result

    def check_cjk(self, result: PageResult):
        b, s = self.browser, self.session
        if not self.cjk_families:
            result.notes.append("CJK text not checked: fontconfig lists no CJK font (apt-get install fonts-noto-cjk)")
            return
        root = b.send("DOM.getDocument", {"depth": 0}, session=s)["root"]["nodeId"]
        nodes = b.send("DOM.querySelectorAll", {"nodeId": root, "selector": "[data-browser-check-cjk]"},
                       session=s)["nodeIds"]
        used, tofu = set(), 0
        for node in nodes:
            fonts = b.send("CSS.getPlatformFontsForNode", {"nodeId": node}, session=s)["fonts"]
            names = {f["familyName"] for f in fonts}
            used |= names
            if not names & self.cjk_families:
                tofu += 1
        if tofu:
            result.faults.append(f"{tofu} of {len(nodes)} elements with CJK text are drawn without a CJK font "
                                 f"(fonts used: {', '.join(sorted(used))})")
        else:
            result.notes.append(f"CJK text drawn with {', '.join(sorted(used & self.cjk_families))}")

    def close(self):
        self.browser.close()


def check_site(html_dir: Path, screenshots: Path | None = None, pages: list[str] | None = None,
               chromium: str | None = None, verbose: bool = False) -> list[PageResult]:
    chromium = chromium or find_chromium()
    if not chromium:
        raise FileNotFoundError(INSTALL_HINT)
    checker = Checker(html_dir, screenshots, chromium, verbose)
    results = []
    try:
        for page in list_pages(checker.html_dir, pages):
            try:
                results.append(checker.check_page(page))
            except CDPError as e:
                r = PageResult(page.relative_to(checker.html_dir).as_posix(), faults=[f"checker failed: {e}"])
                results.append(r)
            if verbose:
                r = results[-1]
                print(f"  {r.page}: {len(r.faults)} faults ({r.seconds:.1f} s)", flush=True)
    finally:
        checker.close()
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("html_dir", nargs="?", default="_build/html", type=Path)
    ap.add_argument("--screenshots", default="_build/screenshots", type=Path,
                    help="folder for the PNG screenshots and report.json (default: %(default)s)")
    ap.add_argument("--no-screenshots", action="store_true")
    ap.add_argument("--pages", nargs="*", help="only pages matching these glob patterns (relative paths)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    if not (args.html_dir / "index.html").exists() and not list_pages(args.html_dir):
        print(f"no built book in {args.html_dir}: run `make book` first", file=sys.stderr)
        return 2
    shots = None if args.no_screenshots else args.screenshots
    start = time.monotonic()
    try:
        results = check_site(args.html_dir, shots, args.pages, verbose=args.verbose)
    except FileNotFoundError as e:
        print(e, file=sys.stderr)
        return 2
    elapsed = time.monotonic() - start
    n_faults = sum(len(r.faults) for r in results)
    for r in results:
        mark = "FAIL" if r.faults else "ok  "
        print(f"{mark} {r.page} ({r.seconds:.1f} s)")
        for f in r.faults:
            print(f"       - {f}")
        for w in r.warnings:
            print(f"       ~ warning: {w}")
        for n in r.notes:
            print(f"       . {n}")
    if shots:
        (shots / "report.json").write_text(json.dumps([r.__dict__ for r in results], indent=1, ensure_ascii=False))
        print(f"screenshots and report.json in {shots}/")
    bad = sum(1 for r in results if r.faults)
    print(f"browser check: {len(results)} pages, {bad} with faults, {n_faults} faults, in {elapsed:.1f} s")
    return 1 if n_faults else 0


if __name__ == "__main__":
    sys.exit(main())
