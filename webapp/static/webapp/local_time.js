// Every <time datetime="..."> a page shows (webapp/templatetags/clockq_format.py, `when`), rewritten
// in the browser's own time zone, in the one format the pages use: 2026-12-02 19:09:56 (with
// milliseconds where data-precision="ms"). Without this script they read in the server's zone,
// which each one's title names; with it, in the browser's, which the footer names.
(function () {
  "use strict";
  const pad = (n, width) => String(n).padStart(width || 2, "0");

  function format(date, precision) {
    let text =
      date.getFullYear() + "-" + pad(date.getMonth() + 1) + "-" + pad(date.getDate()) + " " +
      pad(date.getHours()) + ":" + pad(date.getMinutes()) + ":" + pad(date.getSeconds());
    if (precision === "ms") text += "." + pad(date.getMilliseconds(), 3);
    return text;
  }

  const zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "your time zone";
  window.clockqTime = { format: format, zone: zone };

  function localise() {
    const times = document.querySelectorAll("time[datetime]");
    times.forEach((el) => {
      const date = new Date(el.getAttribute("datetime"));
      if (isNaN(date.getTime())) return;
      el.textContent = format(date, el.dataset.precision);
      el.title = zone;
    });
    const note = document.getElementById("time-zone-note");
    if (note && times.length) {
      document.getElementById("time-zone").textContent = zone;
      note.hidden = false;
    }
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", localise);
  else localise();
})();
