// Export and import (docs/api.md §12; docs/page.md). Exports are plain download links to the
// API; Import sends the chosen file as it is and polls the import's progress by the id it
// gave, showing a progress bar until the server answers. Everything shown is text
// (textContent): an imported title or message is never markup here.
import { ApiError, get, q } from "./api.js";

const POLL_MS = 250;

/** The row menu's export links for one session. */
export function exportLinks(sessionId) {
  const base = `/api/sessions/${encodeURIComponent(sessionId)}/export`;
  return [
    { label: "Export as Markdown", href: `${base}?${q({ format: "markdown" })}` },
    { label: "Export as JSON", href: `${base}?${q({ format: "json" })}` },
  ];
}

function newImportId() {
  const bytes = crypto.getRandomValues(new Uint8Array(12));
  return `imp_${Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("")}`;
}

const PHASES = {
  reading: () => "Uploading…",
  checking: (p) => (p.total ? `Checking ${p.done} of ${p.total}…` : "Checking…"),
  writing: () => "Writing…",
};

function summary(body) {
  const made = body.created === 1 ? "1 session" : `${body.created} sessions`;
  let text = `Imported ${made}`;
  if (body.existing) text += ` (${body.existing} already here)`;
  const skipped = Object.entries(body.skipped || {}).map(([why, n]) => `${n} ${why}`);
  if (skipped.length) text += `; skipped: ${skipped.join(", ").replaceAll("_", " ")}`;
  return `${text}.`;
}

export class ImportControl {
  /** opts: onImported(rows) once the server answered. */
  constructor(opts) {
    this.opts = opts;
    this.button = document.getElementById("import-btn");
    this.input = document.getElementById("import-input");
    this.status = document.getElementById("import-status");
    this.text = document.getElementById("import-text");
    this.bar = document.getElementById("import-progress");
    this.button.addEventListener("click", () => this.input.click());
    this.input.addEventListener("change", () => {
      const file = this.input.files?.[0];
      this.input.value = "";
      if (file) this.run(file);
    });
  }

  show(text, progress) {
    this.status.hidden = false;
    this.text.textContent = text;
    this.bar.hidden = progress === null;
    if (progress) {
      if (progress.total) {
        this.bar.max = progress.total;
        this.bar.value = progress.done;
      } else this.bar.removeAttribute("value"); // indeterminate
    }
  }

  async run(file) {
    const id = newImportId();
    this.button.disabled = true;
    this.status.dataset.state = "running";
    this.show("Uploading…", { done: 0, total: 0 });
    let finished = false;
    const poll = async () => {
      while (!finished) {
        await new Promise((resolve) => setTimeout(resolve, POLL_MS));
        if (finished) return;
        try {
          const p = await get(`/api/imports/${id}`);
          if (!finished && PHASES[p.phase]) this.show(PHASES[p.phase](p), p);
        } catch {
          /* not started yet, or gone: the answer below says how it ended */
        }
      }
    };
    poll();
    try {
      const response = await fetch(`/api/sessions/import?${q({ import_id: id })}`, {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: file,
      });
      const body = await response.json().catch(() => null);
      if (!response.ok) throw new ApiError(response.status, body);
      finished = true;
      this.status.dataset.state = "done";
      this.show(summary(body), null);
      this.opts.onImported?.(body.sessions);
    } catch (err) {
      finished = true;
      this.status.dataset.state = "failed";
      const message = err instanceof ApiError ? err.message : "Tether is not reachable right now.";
      this.show(`Import failed: ${message}`, null);
    } finally {
      this.button.disabled = false;
    }
  }
}
