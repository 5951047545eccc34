// The submit page: shows the chosen workload's params and hides the others'. Without this
// script every workload's fields are shown and the server reads those of the chosen one, so the
// form works the same; the script only hides, notes and catches what a browser would not post.
(function () {
  "use strict";
  const form = document.getElementById("job-form");
  if (!form) return;
  const select = form.querySelector("select[name=workload]");
  const groups = Array.from(form.querySelectorAll("fieldset[data-workload]"));
  const jsonBox = form.querySelector("textarea[name=params]");
  const jsonNote = document.getElementById("params-json-note");

  function showChosen() {
    for (const group of groups) group.hidden = group.dataset.workload !== select.value;
  }

  function noteJson() {
    const filled = jsonBox.value.trim() !== "";
    jsonNote.hidden = !filled;
    for (const group of groups) group.classList.toggle("overridden", filled);
  }

  // A number input holding text it cannot read (say "1e") posts an empty value, which the
  // server would take for the default: say so next to the field instead of posting.
  function refuseUnreadable(event) {
    for (const old of form.querySelectorAll(".errorlist.unreadable")) old.remove();
    let first = null;
    for (const input of form.querySelectorAll("fieldset[data-workload]:not([hidden]) input[type=number]")) {
      if (!input.validity.badInput) continue;
      const list = document.createElement("ul");
      list.className = "errorlist unreadable";
      const item = document.createElement("li");
      item.textContent = input.dataset.param + " must be a number.";
      list.appendChild(item);
      input.before(list);
      first = first || input;
    }
    if (first) {
      event.preventDefault();
      first.focus();
    }
  }

  document.documentElement.classList.add("js");
  select.addEventListener("change", showChosen);
  jsonBox.addEventListener("input", noteJson);
  form.addEventListener("submit", refuseUnreadable);
  showChosen();
  noteJson();
})();
