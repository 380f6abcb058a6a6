// The top bar's menu on narrow windows (style.css shows the Menu button under 760 px): the pages,
// the theme and Sign out fold into one panel, so a phone's bar stays a single row. The panel
// closes when a page is picked, on Esc (the focus goes back to the button) and on a click elsewhere.

const bar = document.querySelector(".topbar");
const button = document.getElementById("menu-button");

function setOpen(open) {
  bar.classList.toggle("open", open);
  button.setAttribute("aria-expanded", String(open));
}

button.addEventListener("click", () => setOpen(button.getAttribute("aria-expanded") !== "true"));
document.getElementById("nav").addEventListener("click", (e) => { if (e.target.closest("a")) setOpen(false); });
window.addEventListener("hashchange", () => setOpen(false));
document.addEventListener("click", (e) => { if (!bar.contains(e.target)) setOpen(false); });
bar.addEventListener("keydown", (e) => {
  if (e.key !== "Escape" || button.getAttribute("aria-expanded") !== "true") return;
  setOpen(false);
  button.focus();
});
