// A headless Chromium for the console tests, driven line by line from Python (tests/console/browser.py):
// each stdin line is a JSON command, each stdout line its JSON answer. Debian's /usr/bin/chromium
// through playwright-core (no browser download), with the flags that keep it from reaching outside
// hosts here (../shared/DESIGN.md: "Testing in a real browser here").
import { chromium } from "playwright-core";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";

const executablePath = process.env.HERD_CHROMIUM || "/usr/bin/chromium";
const profile = mkdtempSync(join(tmpdir(), "herd-chromium-"));
const args = ["--headless", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
  "--disable-component-update", "--disable-sync", "--disable-default-apps", "--disable-extensions",
  "--no-default-browser-check", "--metrics-recording-only", "--disable-dev-shm-usage"];
if (process.getuid && process.getuid() === 0) args.push("--no-sandbox");

const context = await chromium.launchPersistentContext(profile, {
  executablePath, headless: true, args, viewport: { width: 1400, height: 900 }, deviceScaleFactor: 1,
});
const page = context.pages()[0] || await context.newPage();
const errors = [];
page.on("pageerror", (e) => errors.push(String(e)));
page.on("console", (m) => { if (m.type() === "error") errors.push(m.text()); });

async function run(cmd) {
  switch (cmd.op) {
    case "goto": await page.goto(cmd.url, { waitUntil: "load" }); return null;
    case "eval": return await page.evaluate(cmd.expr);
    case "waitFor": {
      // polled from here with page.evaluate (the DevTools protocol): waitForFunction would eval a
      // string inside the page, which the console's Content-Security-Policy rightly refuses
      const deadline = Date.now() + (cmd.timeout ?? 10000);
      let last;
      for (;;) {
        last = await page.evaluate(cmd.expr).catch((e) => ({ __error: String(e) }));
        if (last && !last.__error) return last;
        if (Date.now() > deadline) throw new Error(`timed out waiting for ${cmd.expr}; last value ${JSON.stringify(last)}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    }
    case "click": await page.click(cmd.selector, { timeout: cmd.timeout ?? 10000 }); return null;
    case "fill": await page.fill(cmd.selector, cmd.value, { timeout: cmd.timeout ?? 10000 }); return null;
    case "select": await page.selectOption(cmd.selector, cmd.value, { timeout: cmd.timeout ?? 10000 }); return null;
    case "viewport": await page.setViewportSize({ width: cmd.width, height: cmd.height }); return null;
    case "screenshot": await page.screenshot({ path: cmd.path, fullPage: !!cmd.fullPage }); return null;
    case "errors": return errors.splice(0);
    default: throw new Error(`unknown op ${cmd.op}`);
  }
}

async function close() {
  await context.close().catch(() => {});
  rmSync(profile, { recursive: true, force: true });
}

console.log(JSON.stringify({ ok: true, value: "ready" }));
const rl = createInterface({ input: process.stdin });
for await (const line of rl) {
  if (!line.trim()) continue;
  let cmd;
  try { cmd = JSON.parse(line); } catch (e) { console.log(JSON.stringify({ ok: false, error: `bad json: ${e}` })); continue; }
  if (cmd.op === "close") break;
  try {
    const value = await run(cmd);
    console.log(JSON.stringify({ ok: true, value: value === undefined ? null : value }));
  } catch (e) {
    console.log(JSON.stringify({ ok: false, error: String(e && e.message || e).slice(0, 2000) }));
  }
}
await close();
process.exit(0);
