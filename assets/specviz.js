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
}
