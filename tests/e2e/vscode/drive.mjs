// Drives the VS Code workbench (served by code-server) in Debian's chromium with playwright-core.
// A line protocol for tests/e2e/vscode_harness.py: one JSON request per stdin line,
// {"id", "op", ...args}; one JSON reply per stdout line, {"id", "ok": true, "value"} or
// {"id", "ok": false, "error"}. Ops are small UI gestures a person makes (keys, the command
// palette, quick open) and reads of what is on screen (ghost text, status bar, a screenshot).
import { createInterface } from "node:readline";

const { chromium } = await import(process.env.PLAYWRIGHT_CORE ?? "playwright-core");

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
});
const context = await browser.newContext({ viewport: { width: 1400, height: 900 } });
const page = await context.newPage();
const EDITOR = ".monaco-editor[role=code], .editor-instance .monaco-editor";

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Wait until `probe()` returns a truthy value (polling); the value, or an error after `timeout` ms. */
async function until(probe, timeout, what) {
  const end = Date.now() + timeout;
  for (;;) {
    const value = await probe();
    if (value) return value;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(100);
  }
}

async function palette(prefix, text) {
  await page.keyboard.press(prefix === ">" ? "F1" : "Control+P");
  const input = page.locator(".quick-input-widget input");
  await input.waitFor({ state: "visible", timeout: 10000 });
  await input.fill(prefix + text);
  return input;
}

const ops = {
  async open({ url }) {
    await page.goto(url);
    await page.locator(".monaco-workbench").waitFor({ timeout: 60000 });
    return true;
  },
  /** Open a file of the workspace by name (quick open) and focus its editor. */
  async openFile({ name }) {
    const input = await palette("", name);
    // the list filters asynchronously: wait until the first row is the file asked for
    await page
      .locator(".quick-input-list .monaco-list-row")
      .first()
      .filter({ hasText: name })
      .waitFor({ timeout: 10000 });
    await input.press("Enter");
    await page.locator(`.tab.active[aria-label*="${name}"]`).waitFor({ timeout: 10000 });
    await page.locator(".editor-instance .monaco-editor").first().click({ position: { x: 200, y: 10 } });
    return true;
  },
  /** Put the cursor at a 1-based line and column (Go to Line). */
  async goto({ line, column }) {
    await page.keyboard.press("Control+G");
    const input = page.locator(".quick-input-widget input");
    await input.waitFor({ state: "visible", timeout: 10000 });
    await input.fill(`:${line}:${column}`);
    await input.press("Enter");
    await input.waitFor({ state: "hidden", timeout: 10000 });
    return true;
  },
  /** Run a command from the command palette by its title. */
  async command({ title }) {
    const input = await palette(">", title);
    await page
      .locator(".quick-input-list .monaco-list-row")
      .first()
      .filter({ hasText: title })
      .waitFor({ timeout: 10000 });
    await input.press("Enter");
    return true;
  },
  async press({ key }) {
    await page.keyboard.press(key);
    return true;
  },
  async type({ text }) {
    await page.keyboard.type(text);
    return true;
  },
  /** The ghost text in the focused editor, once some shows (text of its decorations). */
  async ghostText({ timeout = 30000 }) {
    return await until(
      async () => {
        const parts = await page.locator(".editor-instance .ghost-text-decoration, .editor-instance .ghost-text").allTextContents();
        const text = parts.join("\n");
        return text.trim() ? text : "";
      },
      timeout,
      "ghost text",
    );
  },
  /** The text of our status bar item, once it matches `pattern`. */
  async status({ pattern, timeout = 60000 }) {
    const re = new RegExp(pattern);
    return await until(
      async () => {
        const texts = await page.locator(".statusbar-item").allTextContents();
        return texts.find((t) => t.includes("Diffusion") && re.test(t)) ?? "";
      },
      timeout,
      `status bar /${pattern}/`,
    );
  },
  /** The lines the editor shows (view lines, top to bottom as rendered). */
  async visibleText() {
    return await page.evaluate(() => {
      const lines = [...document.querySelectorAll(".editor-instance .view-lines .view-line")];
      lines.sort((a, b) => parseFloat(a.style.top) - parseFloat(b.style.top));
      return lines.map((l) => l.textContent.replace(/\u00a0/g, " ")).join("\n");
    });
  },
  /** Notifications on screen (to report errors). */
  async notifications() {
    return await page.locator(".notification-list-item-message").allTextContents();
  },
  async screenshot({ path }) {
    await page.screenshot({ path });
    return path;
  },
  async wait({ ms }) {
    await sleep(ms);
    return true;
  },
  async close() {
    await browser.close();
    setTimeout(() => process.exit(0), 100);
    return true;
  },
};

const rl = createInterface({ input: process.stdin });
for await (const line of rl) {
  if (!line.trim()) continue;
  const request = JSON.parse(line);
  let reply;
  try {
    const fn = ops[request.op];
    if (!fn) throw new Error(`unknown op ${request.op}`);
    reply = { id: request.id, ok: true, value: await fn(request) };
  } catch (err) {
    reply = { id: request.id, ok: false, error: String(err?.stack ?? err) };
  }
  process.stdout.write(JSON.stringify(reply) + "\n");
}
await browser.close();
