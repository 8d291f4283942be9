// counterfactory gallery: pages of rows from pages/page-NNNNN.js (script files, so the gallery
// opens from disk without a server), filters and search over index/part-NNNNN.js (loaded on first
// use), state in the URL hash (#page=2&q=dog&f=removed%20class:dog) so views can be linked.
(function () {
  "use strict";
  const META = window.GALLERY_META;
  const pages = {};
  const waiting = {};
  let index = null;

  const pad = (n) => String(n).padStart(5, "0");

  function loadScript(src) {
    return new Promise((resolve, reject) => {
      const s = document.createElement("script");
      s.src = src;
      s.onload = resolve;
      s.onerror = () => reject(new Error("cannot load " + src));
      document.head.appendChild(s);
    });
  }

  window.galleryPage = function (n, rows) {
    pages[n] = rows;
    (waiting[n] || []).forEach((resolve) => resolve(rows));
    delete waiting[n];
  };

  function loadPage(n) {
    // pages[0] is there already: index.html loads its script before the page is ready.
    if (pages[n]) return Promise.resolve(pages[n]);
    if (!waiting[n]) {
      waiting[n] = [];
      loadScript("pages/page-" + pad(n) + ".js");
    }
    return new Promise((resolve) => waiting[n].push(resolve));
  }

  const indexParts = [];
  window.galleryIndex = function (k, entries) { indexParts[k] = entries; };

  function loadIndex() {
    if (index) return Promise.resolve(index);
    const loads = [];
    for (let k = 0; k < META.indexParts; k++) loads.push(loadScript("index/part-" + pad(k) + ".js"));
    return Promise.all(loads).then(() => { index = [].concat(...indexParts); return index; });
  }

  function readState() {
    const h = new URLSearchParams(location.hash.slice(1));
    const filters = {};
    h.getAll("f").forEach((f) => { const at = f.indexOf(":"); filters[f.slice(0, at)] = f.slice(at + 1); });
    return { page: Math.max(0, parseInt(h.get("page") || "1", 10) - 1), q: h.get("q") || "", filters };
  }

  function writeState(state) {
    const h = new URLSearchParams();
    if (state.page) h.set("page", state.page + 1);
    if (state.q) h.set("q", state.q);
    Object.entries(state.filters).forEach(([k, v]) => { if (v) h.append("f", k + ":" + v); });
    const hash = h.toString();
    if (hash !== location.hash.slice(1)) location.hash = hash; else render();
  }

  function el(tag, attrs, children) {
    const e = document.createElement(tag);
    Object.entries(attrs || {}).forEach(([k, v]) => { if (k === "text") e.textContent = v; else e.setAttribute(k, v); });
    (children || []).forEach((c) => e.appendChild(c));
    return e;
  }

  function segments(segs) {
    return segs.map(([text, style]) => el(style === "hl" ? "mark" : style === "del" ? "del" : "span",
      style === "hl" ? { class: "hl", text } : { text }));
  }

  function card(rec) {
    // An image the gallery could not show (rec.imgs[k].missing: the reason) is a placeholder.
    const imgs = rec.imgs.map((im) => el("figure", {}, [
      im.src ? el("img", { src: im.src, loading: "lazy", width: im.w, height: im.h, alt: im.label + " of " + rec.id })
        : el("div", { class: "missing", text: "image not shown: " + im.missing }),
      // An image whose metadata holds a GPS position (rec.imgs[k].gps true), or could not be read
      // fully ("unknown": treated as holding one), says so under it.
      el("figcaption", im.gps ? { class: "gps", text: im.label + (im.gps === "unknown"
        ? " · GPS: unknown (could not be read fully) — treated as present" : " · GPS position in its metadata") }
        : { text: im.label })]));
    const texts = rec.texts.map((t) => el("p", {}, [el("span", { class: "label", text: t.label }), ...segments(t.segs)]));
    const chips = [];
    Object.entries(rec.facets).forEach(([k, vs]) => vs.forEach((v) => chips.push(el("span", { text: k + ": " + v }))));
    const meta = el("table", {}, rec.meta.map(([k, v]) => el("tr", {}, [el("td", { text: k }), el("td", { text: v })])));
    return el("article", { class: "row", "data-row": rec.i }, [
      el("header", { text: "#" + rec.i + " · " + rec.id }),
      el("div", { class: "imgs" }, imgs), el("div", { class: "texts" }, texts),
      el("p", { class: "key", text: rec.key.map(([k, v]) => k + " " + v).join(" · ") }),
      el("div", { class: "chips" }, chips),
      el("details", {}, [el("summary", { text: "provenance (" + rec.meta.length + ")" }), meta])]);
  }

  function matches(entry, state) {
    const [, text, facets] = entry;
    if (state.q && !text.includes(state.q.toLowerCase())) return false;
    return Object.entries(state.filters).every(([k, v]) => !v || (facets[k] || []).includes(v));
  }

  function show(recs, total, state) {
    const main = document.getElementById("rows");
    main.replaceChildren(...(recs.length ? recs.map(card) : [el("p", { class: "empty", text: "no rows match" })]));
    const nPages = Math.max(1, Math.ceil(total / META.pageSize));
    document.getElementById("status").textContent =
      "page " + (state.page + 1) + " of " + nPages + " · " + total + " of " + META.rows + " rows";
    document.getElementById("prev").disabled = state.page <= 0;
    document.getElementById("next").disabled = state.page + 1 >= nPages;
    document.body.dataset.ready = JSON.stringify(state);
  }

  let generation = 0;
  function render() {
    const state = readState();
    const mine = ++generation;
    document.getElementById("search").value = state.q;
    document.querySelectorAll("select.facet").forEach((s) => { s.value = state.filters[s.dataset.facet] || ""; });
    const filtered = state.q || Object.values(state.filters).some(Boolean);
    const size = META.pageSize;
    const done = (recs, total) => { if (mine === generation) show(recs, total, state); };
    if (!filtered) {
      loadPage(state.page).then((rows) => done(rows, META.rows));
      return;
    }
    loadIndex().then((entries) => {
      const hits = entries.filter((e) => matches(e, state)).map((e) => e[0]);
      const shown = hits.slice(state.page * size, (state.page + 1) * size);
      const need = [...new Set(shown.map((i) => Math.floor(i / size)))];
      return Promise.all(need.map(loadPage)).then(() =>
        done(shown.map((i) => pages[Math.floor(i / size)][i % size]), hits.length));
    });
  }

  function init() {
    const state = () => readState();
    document.getElementById("prev").onclick = () => { const s = state(); s.page -= 1; writeState(s); };
    document.getElementById("next").onclick = () => { const s = state(); s.page += 1; writeState(s); };
    let timer = null;
    document.getElementById("search").addEventListener("input", (ev) => {
      clearTimeout(timer);
      timer = setTimeout(() => { const s = state(); s.q = ev.target.value.trim(); s.page = 0; writeState(s); }, 200);
    });
    document.querySelectorAll("select.facet").forEach((sel) => sel.addEventListener("change", () => {
      const s = state(); s.filters[sel.dataset.facet] = sel.value; s.page = 0; writeState(s);
    }));
    window.addEventListener("hashchange", render);
    render();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init); else init();
})();
