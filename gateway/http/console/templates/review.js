// modgate console, the reviewer's page: one key per decision (the buttons' data-key). No framework, no build.
"use strict";
(() => {
  const buttons = new Map();
  for (const button of document.querySelectorAll("button[data-key]")) buttons.set(button.dataset.key, button);
  if (buttons.size === 0) return;
  let sent = false;  // one decision per page: a second key press must not post again

  for (const form of new Set([...buttons.values()].map((button) => button.form))) {
    form.addEventListener("submit", (event) => {
      if (sent) event.preventDefault();
      sent = true;
    });
  }

  document.addEventListener("keydown", (event) => {
    if (event.altKey || event.ctrlKey || event.metaKey || event.repeat) return;
    const target = event.target;
    if (target instanceof HTMLInputElement || target instanceof HTMLTextAreaElement) return;
    const button = buttons.get(event.key.toLowerCase());
    if (!button || button.disabled || sent) return;
    event.preventDefault();
    button.classList.add("pressed");
    button.form.requestSubmit(button);
  });
})();
