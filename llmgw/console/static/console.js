// llmgw console: refresh the page's <main> every few seconds without a reload (no inline script: CSP).
// The server renders everything; this only fetches the same URL and swaps <main>. A 401 or a redirect to the
// login form (session expired, control plane restarted) sends the browser to the login form. While a person types
// into a form of <main> (an action's fields), or one of its fields has the focus, <main> is left as it is.
"use strict";
(function () {
  const seconds = Number(document.body.dataset.refresh || 0);
  const log = document.getElementById("log");
  if (log) log.scrollTop = log.scrollHeight;
  if (!seconds) return;
  let typing = false;
  const page = document.getElementById("main");
  if (page) page.addEventListener("input", function () { typing = true; });
  async function refresh() {
    const focused = document.activeElement;
    if (typing || (focused && focused.closest("#main form") && focused.matches("input, textarea, select"))) return;
    try {
      const response = await fetch(window.location.href, {headers: {"Accept": "text/html"}, credentials: "same-origin"});
      if (response.status === 401 || response.url.endsWith("/console/login")) {
        window.location.assign("/console/login");
        return;
      }
      if (!response.ok) return;
      const doc = new DOMParser().parseFromString(await response.text(), "text/html");
      const fresh = doc.getElementById("main");
      const main = document.getElementById("main");
      if (fresh && main) {
        main.replaceChildren(...fresh.childNodes);
        const log = document.getElementById("log");
        if (log) log.scrollTop = log.scrollHeight;  // a followed log shows its newest lines
        document.body.dataset.refreshed = String(Date.now());
      }
    } catch (error) {
      // the control plane is away (restarting): keep the page and try again later
    }
  }
  window.setInterval(refresh, seconds * 1000);
})();
