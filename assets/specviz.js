() => {
  // The token view follows a live run's newest tokens, as a terminal does, unless the reader has
  // scrolled up in it: then it stays where they left it, frame after frame, until they scroll back
  // to the end or a new run starts. (Each frame redraws the view, which put it back at its top, and
  // the newest tokens grew out of sight below a box of 460 px, 320 px on a phone.)
  const NEAR = 48;  // px from the end that still counts as "at the end"
  let follow = true, kept = 0, seen = 0, queued = false;
  document.addEventListener("scroll", (ev) => {
    const el = ev.target;
    if (!(el instanceof Element) || !el.classList.contains("sv-tokens")) return;
    follow = el.scrollHeight - el.scrollTop - el.clientHeight < NEAR;
    kept = el.scrollTop;
  }, true);
  const settle = () => {
    queued = false;
    const el = document.querySelector("#sv-tokens .sv-tokens");
    if (!el) return;
    const n = el.querySelectorAll(".sv-it").length;
    if (n < seen) { follow = true; kept = 0; }  // fewer iterations than before: another run began
    seen = n;
    const top = follow ? el.scrollHeight : kept;
    if (Math.abs(el.scrollTop - top) > 1) el.scrollTop = top;
  };
  new MutationObserver(() => {
    if (!queued) { queued = true; requestAnimationFrame(settle); }
  }).observe(document.body, {childList: true, subtree: true});

  // A click on a token (or Enter on it) opens its iteration in the inspector once the run has ended
  // (the inspector's Iteration slider is live then): the inspector's tab opens and the slider moves
  // there, which redraws the inspector as dragging it would. During a run it does nothing.
  const inspect = (tok) => {
    const it = tok.closest(".sv-done .sv-it");  // sv-done: the view a run (or a replay) ended with
    if (!it || it.dataset.it === undefined) return;
    const tab = [...document.querySelectorAll("button[role=tab]")]
      .find((b) => b.textContent.trim() === "Iteration inspector");
    const range = () => document.querySelector("#sv-iteration input[type=range]");
    if (!range() && !tab) return;
    if (range()?.disabled) return;
    tab?.click();
    let tries = 0;
    const move = () => {  // the tab's content may be drawn only once the tab opens
      const r = range();
      if (!r) { if (++tries < 20) setTimeout(move, 50); return; }
      // on a narrow screen the inspector opens below the token view, out of sight: bring it up
      const box = document.getElementById("sv-iteration");
      const at = box?.getBoundingClientRect();
      if (at && (at.top < 0 || at.bottom > window.innerHeight - 160)) box.scrollIntoView({block: "start"});
      if (r.disabled || r.value === it.dataset.it) return;
      r.value = it.dataset.it;
      r.dispatchEvent(new Event("input", {bubbles: true}));
      r.dispatchEvent(new Event("change", {bubbles: true}));
    };
    move();
  };
  const token = (ev) => ev.target instanceof Element ? ev.target.closest("#sv-tokens .sv-tok") : null;
  document.addEventListener("click", (ev) => { const t = token(ev); if (t) inspect(t); });
  document.addEventListener("keydown", (ev) => { const t = ev.key === "Enter" && token(ev); if (t) inspect(t); });
}
