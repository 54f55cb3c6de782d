// Keyboard navigation of an action's timeline: j / ArrowDown and k / ArrowUp move between runs,
// Enter or Space opens or closes the focused run's fields. Nothing else needs script.
(function () {
  "use strict";
  function runs() { return Array.prototype.slice.call(document.querySelectorAll(".timeline > .run")); }
  document.addEventListener("keydown", function (event) {
    var target = event.target;
    if (!target || !target.classList || !target.classList.contains("run")) { return; }
    var all = runs(), index = all.indexOf(target);
    if (event.key === "j" || event.key === "ArrowDown") {
      if (index < all.length - 1) { all[index + 1].focus(); }
      event.preventDefault();
    } else if (event.key === "k" || event.key === "ArrowUp") {
      if (index > 0) { all[index - 1].focus(); }
      event.preventDefault();
    } else if (event.key === "Enter" || event.key === " ") {
      var details = target.querySelector("details");
      if (details) { details.open = !details.open; }
      event.preventDefault();
    }
  });
})();
