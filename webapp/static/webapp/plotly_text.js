// Text for Plotly charts. Plotly reads its own markup in every hover label, trace name, tick label
// and annotation: <b>, <i>, <br>, <span style=...>, <a href=...>. Job names, reasons, usernames
// and worker names are other people's text, so every one of them goes through `plain` (or `lines`,
// which also wraps) before a chart gets it; a chart's own markup (<br>, <extra>) is added after.
// Plotly turns the entities back into the characters, so a name shows exactly as it was typed.
window.clockqPlotText = (function () {
  "use strict";

  function plain(text) {
    return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  // Plotly's hover labels do not wrap, so a long line (a promotion's full reason) ran off the
  // chart and was cut mid-sentence. Break it at spaces into lines of at most `width` characters.
  function lines(text, width = 72) {
    const out = [];
    let line = "";
    for (const word of plain(text).split(" ")) {
      if (line && line.length + 1 + word.length > width) {
        out.push(line);
        line = word;
      } else {
        line = line ? line + " " + word : word;
      }
    }
    out.push(line);
    return out.join("<br>");
  }

  return { plain: plain, lines: lines };
})();
