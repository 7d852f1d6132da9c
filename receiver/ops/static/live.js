// Live updates of the ops inbox's pages (receiver/ops/inbox.py): the part of the page inside
// #live is fetched again every few seconds (its own URL, `data-live`) and put in place when it
// changed. Served by the product itself under a CSP of script-src 'self'; the page works the
// same without it (a reload shows the same). Nothing here reads or sends anything but that URL.
(function () {
  "use strict";
  var box = document.getElementById("live");
  var status = document.getElementById("live-status");
  if (!box || !window.fetch) return;
  var url = box.getAttribute("data-live");
  var every = 3000;
  var last = null;
  var busy = false;
  var stopped = false;

  function say(text) {
    if (!status) return;
    status.hidden = false;
    status.textContent = text;
  }

  function tick() {
    if (busy || stopped || document.hidden) return;
    busy = true;
    fetch(url, { credentials: "same-origin", cache: "no-store", redirect: "manual" })
      .then(function (answer) {
        if (answer.type === "opaqueredirect" || answer.status === 303 || answer.status === 403) {
          stopped = true; // signed out: the next reload goes to the sign-in page
          say("Live updates stopped: sign in again (reload the page).");
          return null;
        }
        if (!answer.ok) throw new Error("HTTP " + answer.status);
        return answer.text();
      })
      .then(function (html) {
        if (html === null) return;
        if (html !== last) {
          box.innerHTML = html; // rendered and escaped by the server, as the page itself
          last = html;
        }
        say("Live: up to date, checked every 3 s.");
      })
      .catch(function () {
        say("Live updates failing; retrying (the page may be stale).");
      })
      .then(function () {
        busy = false;
      });
  }

  tick();
  setInterval(tick, every);
  document.addEventListener("visibilitychange", tick);
})();
