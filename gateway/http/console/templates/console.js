// modgate console: refresh the page's panels every few seconds. No framework, no build step.
"use strict";
(() => {
  const root = document.getElementById("console");
  if (!root) return;
  const url = root.dataset.pollUrl;
  const every = Math.max(1, Number(root.dataset.pollSeconds) || 3) * 1000;
  const flipForm = document.getElementById("flip-form");
  const stale = document.getElementById("stale-notice");
  const refreshed = document.getElementById("refreshed");
  let leaving = false;

  function showStale(version, mode) {
    stale.textContent = `The policy changed since this page loaded: version ${version} is in force ` +
      `(thinking ${mode.toUpperCase()}). Reload the page before flipping.`;
    stale.hidden = false;
    for (const button of flipForm.querySelectorAll("button")) button.disabled = true;
  }

  async function refresh() {
    try {
      const response = await fetch(url, {
        credentials: "same-origin", cache: "no-store", headers: { Accept: "application/json" },
      });
      if (response.status === 401) {  // the session expired: back to the sign-in form
        leaving = true;
        window.location.assign("/console");
        return;
      }
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const data = await response.json();
      for (const [name, html] of Object.entries(data.panels)) {
        const panel = document.getElementById(`panel-${name}`);
        if (panel) panel.innerHTML = html;
      }
      if (flipForm && String(data.policy_version) !== flipForm.dataset.version) {
        showStale(data.policy_version, data.default_mode);
      }
      refreshed.textContent = `live · updated ${new Date().toLocaleTimeString()}`;
      refreshed.classList.remove("offline");
    } catch (error) {
      refreshed.textContent = `not updating (${error.message})`;
      refreshed.classList.add("offline");
    } finally {
      if (!leaving) window.setTimeout(refresh, every);
    }
  }

  window.setTimeout(refresh, every);
})();
