// modgate console, the reviewer's page: one key per decision (the buttons' data-key), one per category a
// block names (the checkboxes' data-toggle: tick, untick, then block with "b"). No framework, no build.
"use strict";
(() => {
  const buttons = new Map();
  for (const button of document.querySelectorAll("button[data-key]")) buttons.set(button.dataset.key, button);
  const toggles = new Map();
  for (const box of document.querySelectorAll("input[data-toggle]")) toggles.set(box.dataset.toggle, box);
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
    const typing = target instanceof HTMLInputElement && target.type !== "checkbox";
    if (typing || target instanceof HTMLTextAreaElement) return;
    const box = toggles.get(event.key);
    if (box && !sent) {
      event.preventDefault();
      box.checked = !box.checked;
      return;
    }
    const button = buttons.get(event.key.toLowerCase());
    if (!button || button.disabled || sent) return;
    event.preventDefault();
    button.classList.add("pressed");
    button.form.requestSubmit(button);
  });
})();
